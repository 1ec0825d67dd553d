"""Dead backends, 5xx before the first byte, broken streams, timeouts, no healthy backend,
client disconnects: the retry rules and the errors the client gets."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from continuum_common.procs import free_port
from continuum_testing.ingress_harness import RunningIngress, running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**BODY, "stream": True}


def http(ing: RunningIngress, timeout: float = 10) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=ing.url, timeout=timeout, verify=False)


async def counter(c: httpx.AsyncClient, name: str) -> dict[str, float]:
    out = {}
    for line in (await c.get("/metrics")).text.splitlines():
        if line.startswith(name + "{"):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


async def test_dead_backend_is_retried_then_skipped() -> None:
    dead = {"name": "dead", "url": f"http://127.0.0.1:{free_port()}", "type": "openai", "models": ["m"]}
    async with running_stubs("live") as stubs:
        cfg = {"backends": [dead, *stub_backends(stubs)]}  # RoundRobin: dead, live, dead, ...
        async with running_ingress(cfg) as ing, http(ing) as c:
            for _ in range(10):
                r = await c.post("/v1/chat/completions", json=BODY)
                assert r.status_code == 200 and r.headers["x-continuum-backend"] == "live"
            retries = await counter(c, "continuum_ingress_retries_total")
            attempts = await counter(c, "continuum_backend_requests_total")
            backends = (await c.get("/admin/backends")).status_code
    # Three connect failures open the dead backend's circuit; after that it is not tried.
    assert retries['{reason="connect_error"}'] == 3
    assert attempts['{backend="dead",outcome="connect_error"}'] == 3
    assert len(stubs[0].stub.requests) == 10
    assert backends == 401  # admin stays locked without a token


@pytest.mark.parametrize("body", [BODY, STREAM], ids=["non-stream", "stream"])
async def test_5xx_before_the_first_byte_is_retried_once_on_the_next_backend(body: dict[str, object]) -> None:
    async with running_stubs("a", "b") as stubs:
        a, b = (s.stub for s in stubs)
        a.fail_next = 1  # RoundRobin on a fresh ingress asks `a` first
        async with running_ingress({"backends": stub_backends(stubs)}) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=body)
            retries = await counter(c, "continuum_ingress_retries_total")
    assert r.status_code == 200 and r.headers["x-continuum-backend"] == "b"
    assert (
        r.text.endswith("data: [DONE]\n\n")
        if body is STREAM
        else r.json()["choices"][0]["message"]["content"] == "hello from b"
    )
    assert (len(a.requests), len(b.requests)) == (1, 1)
    assert retries['{reason="server_error"}'] == 1


async def test_two_failed_attempts_are_a_502_and_the_third_backend_is_not_asked() -> None:
    async with running_stubs("a", "b", "c") as stubs:
        a, b, c_ = (s.stub for s in stubs)
        a.fail_next = b.fail_next = 1
        a.fail_status = b.fail_status = 503
        async with running_ingress({"backends": stub_backends(stubs)}) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 502
    error = r.json()["error"]
    assert error["code"] == "backend_error" and "HTTP 503" in error["message"] and error["type"] == "api_error"
    assert (len(a.requests), len(b.requests), len(c_.requests)) == (1, 1, 0)


async def test_a_4xx_is_passed_through_and_not_retried() -> None:
    async with running_stubs("a", "b") as stubs:
        stubs[0].stub.fail_next, stubs[0].stub.fail_status = 1, 422
        async with running_ingress({"backends": stub_backends(stubs)}) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 422 and r.json()["error"]["message"] == "a failed"
    assert len(stubs[1].stub.requests) == 0


async def test_a_broken_stream_is_not_retried_and_ends_with_an_error_event() -> None:
    async with running_stubs("a", "b") as stubs:
        stubs[0].stub.break_stream_after = stubs[1].stub.break_stream_after = 2
        async with running_ingress({"backends": stub_backends(stubs)}) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=STREAM)
            assert r.status_code == 200  # the status line went out with the first chunk
            assert len(stubs[1].stub.requests) == 0  # no retry once streaming began
            events = [e for e in r.text.split("\n\n") if e]
            assert len(events) == 3 and "[DONE]" not in r.text
            assert "broke off the stream" in orjson.loads(events[-1][len("data: ") :])["error"]["message"]
            r = await c.post(
                "/anthropic/v1/messages",
                json={"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]},
            )
            assert r.text.rstrip().split("\n\n")[-1].startswith("event: error")
    assert (len(stubs[0].stub.requests), len(stubs[1].stub.requests)) == (1, 1)


async def test_read_timeout_is_a_504_without_retry() -> None:
    async with running_stubs("slow", "other") as stubs:
        stubs[0].stub.delay = 2.0
        backends = stub_backends(stubs, request_timeout_ms=200)
        async with running_ingress({"backends": backends}) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 504 and r.json()["error"]["code"] == "backend_timeout"
    assert len(stubs[1].stub.requests) == 0


async def test_no_healthy_backend_is_a_503_and_recovery_is_automatic() -> None:
    async with (
        running_stubs("a", "b") as stubs,
        running_ingress({"backends": stub_backends(stubs)}) as ing,
        http(ing) as c,
    ):
        for s in stubs:
            s.stub.health_status = 503
        await asyncio.sleep(0.5)  # two failed checks at 100 ms
        r = await c.post("/v1/chat/completions", json=BODY)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_backend"
        r = await c.post(
            "/anthropic/v1/messages",
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        assert sum(len(s.stub.requests) for s in stubs) == 0
        ready = (await c.get("/readyz")).json()
        assert ready["healthy_backends"] == 0
        stubs[1].stub.health_status = 200
        await asyncio.sleep(0.3)
        r = await c.post("/v1/chat/completions", json=BODY)
        assert r.status_code == 200 and r.headers["x-continuum-backend"] == "b"


async def test_client_disconnect_cancels_the_upstream_request() -> None:
    async with running_stubs("a") as stubs:
        stub = stubs[0].stub
        async with running_ingress({"backends": stub_backends(stubs)}) as ing:
            stub.hang = True
            async with http(ing, timeout=0.3) as c:
                try:
                    await c.post("/v1/chat/completions", json=BODY)
                except httpx.ReadTimeout:
                    pass
            for _ in range(100):
                if stub.cancelled == 1:
                    break
                await asyncio.sleep(0.02)
            assert stub.cancelled == 1
            stub.hang = False
            # Mid-stream: the client reads the first chunk and goes away.
            stub.chunk_delay = 0.2
            async with http(ing) as c, c.stream("POST", "/v1/chat/completions", json=STREAM) as r:
                async for _ in r.aiter_bytes():
                    break
            for _ in range(100):
                if stub.cancelled == 2:
                    break
                await asyncio.sleep(0.02)
            assert stub.cancelled == 2
            state = ing.app.pool.get("a")
            assert state is not None and state.in_flight == 0 and state.breaker_state == 0
            async with http(ing) as c:
                disconnects = (await c.get("/metrics")).text
            assert "continuum_ingress_client_disconnects_total 2.0" in disconnects


async def test_a_stream_without_a_first_token_in_time_is_retried_on_another_backend() -> None:
    async with running_stubs("a", "b") as stubs:
        a = stubs[0].stub
        a.chunk_delay = 3.0  # the head at once, the first token after 3 s
        backends = stub_backends(stubs, first_byte_timeout_ms=400)
        async with running_ingress({"backends": backends}) as ing, http(ing) as c:
            started = asyncio.get_running_loop().time()
            r = await c.post("/v1/chat/completions", json=STREAM)
            elapsed = asyncio.get_running_loop().time() - started
            retries = await counter(c, "continuum_ingress_retries_total")
            attempts = await counter(c, "continuum_backend_requests_total")
    # The head went out when a's came, before its first token; b's answer follows under it.
    assert r.status_code == 200 and r.headers["x-continuum-backend"] == "a"
    assert r.text.endswith("data: [DONE]\n\n")
    assert '"content":"b"' in r.text and '"content":"a"' not in r.text  # one answer, b's alone
    assert elapsed < 2.5
    assert retries['{reason="first_byte_timeout"}'] == 1
    assert attempts['{backend="a",outcome="timeout"}'] == 1
    for _ in range(40):  # the abandoned upstream request was closed (the engine stops generating)
        if a.cancelled:
            break
        await asyncio.sleep(0.05)
    assert a.cancelled == 1


async def test_a_stream_no_backend_starts_ends_with_an_error_event_under_its_early_head() -> None:
    """Both backends send their head at once and no first token in time: the client already
    has a 200 head (sent when a's came), so the failure arrives in-band, in the provider's
    shape, and the request is counted with the error's status."""
    async with running_stubs("a", "b") as stubs:
        for stub in stubs:
            stub.stub.chunk_delay = 3.0
        backends = stub_backends(stubs, first_byte_timeout_ms=300)
        async with running_ingress({"backends": backends}) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=STREAM)
            retries = await counter(c, "continuum_ingress_retries_total")
            requests = await counter(c, "continuum_ingress_requests_total")
    assert r.status_code == 200 and r.headers["x-continuum-backend"] == "a"
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert len(events) == 1 and '"code":null' in events[0]
    assert "sent no first token within 0.3s" in events[0] and '"type":"api_error"' in events[0]
    assert retries['{reason="first_byte_timeout"}'] == 1
    assert requests['{endpoint="chat_completions",status="5xx"}'] == 1  # the 504, though the head said 200


async def test_a_retried_stream_answered_with_an_error_status_ends_in_band() -> None:
    """a sends its head and misses the first token; b answers the retry 400. The client holds
    a's 200 head, so b's refusal cannot be its status: the stream ends with an error event."""
    async with running_stubs("a", "b") as stubs:
        stubs[0].stub.chunk_delay = 3.0
        stubs[1].stub.fail_next, stubs[1].stub.fail_status = 1, 400
        backends = stub_backends(stubs, first_byte_timeout_ms=300)
        async with running_ingress({"backends": backends}) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=STREAM)
            again = await c.post("/v1/chat/completions", json=STREAM)  # the service keeps serving
    assert r.status_code == 200 and r.headers["x-continuum-backend"] == "a"
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert len(events) == 1 and "answered HTTP 400 to a retried stream" in events[0]
    assert again.status_code == 200 and again.text.endswith("data: [DONE]\n\n")


async def test_a_stream_that_stalls_mid_way_ends_with_an_error_event_and_counts_a_failure() -> None:
    async with running_stubs("a") as stubs:
        a = stubs[0].stub
        a.stall_after, a.stall_s = 2, 5.0  # two events, then silence
        backends = stub_backends(stubs, stream_idle_timeout_ms=300)
        async with running_ingress({"backends": backends}) as ing, http(ing) as c:
            started = asyncio.get_running_loop().time()
            r = await c.post("/v1/chat/completions", json=STREAM)
            elapsed = asyncio.get_running_loop().time() - started
            attempts = await counter(c, "continuum_backend_requests_total")
            state = ing.app.pool.get("a")
            assert state is not None
            window = state.success_rate
    assert r.status_code == 200  # the status line was long gone
    assert '"hello "' in r.text  # the events before the stall arrived
    assert "sent nothing for 0.3s mid-stream" in r.text and "[DONE]" not in r.text
    assert elapsed < 2.5
    assert attempts['{backend="a",outcome="timeout"}'] == 1
    assert window < 1.0  # the failure is in the backend's outcome window (what the breaker reads)


@pytest.mark.parametrize("body", [BODY, STREAM], ids=["non-stream", "stream"])
async def test_requests_waiting_on_a_backend_taken_out_by_health_checks_move_at_once(body: dict[str, object]) -> None:
    async with running_stubs("a", "b") as stubs:
        a, b = (s.stub for s in stubs)
        a.hang = True  # accepts, never answers (a stopped engine)
        async with running_ingress({"backends": stub_backends(stubs)}) as ing, http(ing) as c:
            request = asyncio.ensure_future(c.post("/v1/chat/completions", json=body))
            for _ in range(100):
                if a.requests:
                    break
                await asyncio.sleep(0.02)
            assert a.requests and not request.done()
            loop = asyncio.get_running_loop()
            a.health_status = 503
            down_at = loop.time()
            r = await asyncio.wait_for(request, 5)
            moved_after = loop.time() - down_at
            retries = await counter(c, "continuum_ingress_retries_total")
    assert r.status_code == 200 and r.headers["x-continuum-backend"] == "b"
    assert moved_after < 2.0  # two failed checks 100 ms apart, not the 600 s request timeout
    assert retries['{reason="backend_down"}'] == 1
    assert len(b.requests) == 1
