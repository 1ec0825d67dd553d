"""The aiohttp transport (the benchmark's alternative to the HTTP/1.1 pool) behind a real
ingress and real upstream servers on loopback: answers, streams, connect failures retried,
the stream-idle timeout, and the client's disconnect reaching the backend."""

from __future__ import annotations

import asyncio

import httpx

from continuum_common.procs import free_port
from continuum_ingress.adapters.aiohttp_transport import aiohttp_transport
from continuum_testing.ingress_harness import RunningIngress, running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**BODY, "stream": True}


def http(ing: RunningIngress) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=ing.url, timeout=10, verify=False)


async def test_answers_and_streams_pass_through() -> None:
    async with (
        running_stubs("a") as stubs,
        running_ingress({"backends": stub_backends(stubs)}, transport=aiohttp_transport) as ing,
        http(ing) as c,
    ):
        whole = await c.post("/v1/chat/completions", json=BODY)
        stream = await c.post("/v1/chat/completions", json=STREAM)
    assert whole.status_code == 200 and whole.json()["choices"][0]["message"]["content"] == "hello from a"
    assert whole.headers["x-continuum-backend"] == "a"
    assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n")
    sent = stubs[0].stub.requests[0]
    assert sent.headers["accept-encoding"] == "identity" and "user-agent" not in sent.headers


async def test_a_dead_backend_is_retried_on_the_next() -> None:
    dead = {"name": "dead", "url": f"http://127.0.0.1:{free_port()}", "type": "openai", "models": ["m"]}
    async with running_stubs("live") as stubs:
        cfg = {"backends": [dead, *stub_backends(stubs)]}  # RoundRobin asks `dead` first
        async with running_ingress(cfg, transport=aiohttp_transport) as ing, http(ing) as c:
            r = await c.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 200 and r.headers["x-continuum-backend"] == "live"


async def test_a_stalled_stream_ends_after_the_idle_timeout() -> None:
    async with running_stubs("a") as stubs:
        a = stubs[0].stub
        a.stall_after, a.stall_s = 2, 5.0
        backends = stub_backends(stubs, stream_idle_timeout_ms=300)
        async with running_ingress({"backends": backends}, transport=aiohttp_transport) as ing, http(ing) as c:
            started = asyncio.get_running_loop().time()
            r = await c.post("/v1/chat/completions", json=STREAM)
            elapsed = asyncio.get_running_loop().time() - started
    assert "sent nothing for 0.3s mid-stream" in r.text and "[DONE]" not in r.text
    assert elapsed < 2.5


async def test_a_client_that_leaves_mid_stream_closes_the_upstream_connection() -> None:
    async with running_stubs("a") as stubs:
        a = stubs[0].stub
        a.stall_after, a.stall_s = 1, 5.0
        async with running_ingress({"backends": stub_backends(stubs)}, transport=aiohttp_transport) as ing:
            async with http(ing) as c, c.stream("POST", "/v1/chat/completions", json=STREAM) as r:
                async for _ in r.aiter_bytes():
                    break
            for _ in range(100):
                if a.cancelled:
                    break
                await asyncio.sleep(0.05)
    assert a.cancelled == 1
