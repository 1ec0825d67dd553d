"""The response cache inside the real ingress (loopback HTTP, uvicorn), driven by the official
`openai` and `anthropic` SDKs against simulated vLLM engines (continuum_sim.SimFleet), with the
memory store and with a real redis-server (issue 5, "Done when").

Whether a request reached an engine is read from the engines' own request counters, and a HIT
carries no `x-continuum-backend` header (no backend was chosen).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import pytest_asyncio

from continuum_common.procs import RedisServer
from continuum_sim import SimFleet
from continuum_testing.cache_support import (
    ADMIN,
    ADMIN_ENV,
    ADMIN_TOKEN,
    cache_config,
    engine_requests,
    metric,
    wait_entries,
)
from continuum_testing.ingress_harness import running_ingress

SYSTEM = "You are a terse assistant for a hardware shop. " * 4
MESSAGES: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which drill for concrete?"}]


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(2, time_scale=0.01) as running:
        yield running


def _store(backend: str, redis: RedisServer | None) -> dict[str, Any]:
    if backend == "redis":
        assert redis is not None
        return {"backend": "redis", "redis": {"url": redis.url}}
    return {"backend": "memory"}


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> dict[str, Any]:
    return _store(request.param, redis_server)


def _openai(url: str, key: str = "sk-tenant-a") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=key, base_url=f"{url}/v1", max_retries=0, timeout=15)


async def _chat(oc: openai.AsyncOpenAI, model: str, **extra: Any) -> tuple[str | None, str | None, bytes]:
    """(X-Cache, x-continuum-backend, raw body) of one non-stream chat completion."""
    raw = await oc.chat.completions.with_raw_response.create(
        model=model, messages=extra.pop("messages", MESSAGES), max_tokens=8, **{"temperature": 0, **extra}
    )
    raw.parse()  # the SDK accepts the body
    return raw.headers.get("x-cache"), raw.headers.get("x-continuum-backend"), raw.content


async def _chat_stream(oc: openai.AsyncOpenAI, model: str) -> tuple[str | None, str | None, bytes]:
    async with oc.chat.completions.with_streaming_response.create(
        model=model,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        data = b"".join([chunk async for chunk in response.iter_bytes()])
        return response.headers.get("x-cache"), response.headers.get("x-continuum-backend"), data


async def test_miss_then_hit_non_stream_and_stream(fleet: SimFleet, store: dict[str, Any]) -> None:
    model = fleet.endpoints[0].model
    async with running_ingress(cache_config(fleet.router_backends(), **store)) as ing, _openai(ing.url) as oc:
        before = engine_requests(fleet)
        miss = await _chat(oc, model)
        assert miss[0] == "MISS" and miss[1] in {"sim-0", "sim-1"}
        await wait_entries(ing.url, 1)
        hit = await _chat(oc, model)
        assert hit[0] == "HIT" and hit[1] is None  # no backend chosen
        assert hit[2] == miss[2]  # byte-identical body (same id, created, usage)
        assert engine_requests(fleet) == before + 1

        stream_miss = await _chat_stream(oc, model)
        assert stream_miss[0] == "MISS" and stream_miss[2].endswith(b"data: [DONE]\n\n")
        await wait_entries(ing.url, 2)
        stream_hit = await _chat_stream(oc, model)
        assert stream_hit[0] == "HIT" and stream_hit[1] is None
        assert stream_hit[2] == stream_miss[2]  # every chunk, usage chunk included
        assert engine_requests(fleet) == before + 2
        # The SDK reads the replayed stream like the original one.
        chunks = [
            c
            async for c in await oc.chat.completions.create(
                model=model,
                messages=MESSAGES,
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert await metric(ing.url, "continuum_response_cache_requests_total", result="hit") == 3
        assert await metric(ing.url, "continuum_response_cache_requests_total", result="miss") == 2
        # Embeddings are not cached and carry no X-Cache header.
        emb = await oc.embeddings.with_raw_response.create(model=model, input="hello")
        assert emb.headers.get("x-cache") is None and emb.headers.get("x-continuum-backend")


async def test_completions_and_anthropic_messages_are_cached(fleet: SimFleet, redis_server: RedisServer) -> None:
    model = fleet.endpoints[0].model
    async with (
        # the Anthropic SDK sends no temperature (its newest API version refuses the field):
        # caching its answers is the operator's opt-in
        running_ingress(
            cache_config(fleet.router_backends(), cache_omitted_temperature=True, **_store("redis", redis_server))
        ) as ing,
        _openai(ing.url) as oc,
    ):
        first = await oc.completions.with_raw_response.create(
            model=model, prompt="Once upon a time", max_tokens=4, temperature=0
        )
        await wait_entries(ing.url, 1)
        again = await oc.completions.with_raw_response.create(
            model=model, prompt="Once upon a time", max_tokens=4, temperature=0
        )
        assert (first.headers["x-cache"], again.headers["x-cache"]) == ("MISS", "HIT")
        assert again.content == first.content

        async with anthropic.AsyncAnthropic(
            api_key="sk-tenant-a", base_url=f"{ing.url}/anthropic", max_retries=0, timeout=15
        ) as ac:
            request: dict[str, Any] = {
                "model": model,
                "max_tokens": 8,  # no temperature: eligible here only through cache_omitted_temperature
                "system": SYSTEM,
                "messages": [{"role": "user", "content": "hi"}],
            }
            msg = await ac.messages.with_raw_response.create(**request)
            await wait_entries(ing.url, 2)
            msg_hit = await ac.messages.with_raw_response.create(**request)
            assert (msg.headers["x-cache"], msg_hit.headers["x-cache"]) == ("MISS", "HIT")
            assert await msg_hit.read() == await msg.read()
            assert (await msg_hit.parse()).content[0].text  # type: ignore[union-attr]

            before = engine_requests(fleet)
            streamed = []
            for expected in ("MISS", "HIT"):
                async with ac.messages.with_streaming_response.create(**request, stream=True) as response:
                    assert response.headers["x-cache"] == expected
                    streamed.append(b"".join([c async for c in response.iter_bytes()]))
                await wait_entries(ing.url, 3)
            assert streamed[0] == streamed[1] and streamed[0].rstrip().endswith(b'{"type":"message_stop"}')
            async with ac.messages.stream(**request) as st:  # the SDK's stream helper on a replay
                assert "".join([t async for t in st.text_stream])
            assert engine_requests(fleet) == before + 1


async def test_responses_api_answers_and_streams_are_cached(fleet: SimFleet) -> None:
    model = fleet.endpoints[0].model
    request: dict[str, Any] = {
        "model": model, "instructions": SYSTEM, "input": "Which drill for concrete?", "max_output_tokens": 8,
        "temperature": 0,
    }  # fmt: skip
    async with running_ingress(cache_config(fleet.router_backends(), backend="memory")) as ing, _openai(ing.url) as oc:
        before = engine_requests(fleet)
        first = await oc.responses.with_raw_response.create(**request)
        await wait_entries(ing.url, 1)
        again = await oc.responses.with_raw_response.create(**request)
        assert (first.headers["x-cache"], again.headers["x-cache"]) == ("MISS", "HIT")
        assert again.content == first.content and again.parse().output_text
        streamed = []
        for expected in ("MISS", "HIT"):
            async with oc.responses.with_streaming_response.create(**request, stream=True) as response:
                assert response.headers["x-cache"] == expected
                streamed.append(b"".join([c async for c in response.iter_bytes()]))
            await wait_entries(ing.url, 2)
        assert streamed[0] == streamed[1] and b"event: response.incomplete" in streamed[0]  # cut at 8 tokens
        events = [e async for e in await oc.responses.create(**request, stream=True)]  # the SDK reads a replay
        assert events[-1].type == "response.incomplete" and events[-1].response.output_text
        assert engine_requests(fleet) == before + 2
        # A request that continues a stored response is keyed apart (the engine does not know that id).
        with pytest.raises(openai.NotFoundError):
            await oc.responses.create(**request, previous_response_id="resp_1")


async def test_bypass_tenants_and_output_shaping_fields(fleet: SimFleet) -> None:
    model = fleet.endpoints[0].model
    async with running_ingress(cache_config(fleet.router_backends())) as ing, _openai(ing.url) as oc:
        before = engine_requests(fleet)
        assert [(await _chat(oc, model, temperature=0.7))[0] for _ in range(2)] == ["BYPASS", "BYPASS"]
        # an omitted temperature samples at the provider's default (1.0): not cached either
        omitted = await oc.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=8)
        assert omitted.headers["x-cache"] == "BYPASS"
        assert engine_requests(fleet) == before + 3
        assert await metric(ing.url, "continuum_response_cache_requests_total", result="skip") == 3

        # Tenants: another API key never sees tenant A's entry.
        assert (await _chat(oc, model))[0] == "MISS"
        async with _openai(ing.url, "sk-tenant-b") as other_tenant:
            assert (await _chat(other_tenant, model))[0] == "MISS"
            assert (await _chat(other_tenant, model))[0] == "HIT"
        assert (await _chat(oc, model))[0] == "HIT"

        # Requests that differ only in one output-shaping field never share an entry.
        tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
        variants: list[dict[str, Any]] = [
            {"tools": [tool]},
            {"response_format": {"type": "json_object"}},
            {"stop": ["\n"]},
            {"seed": 7},
        ]
        before = engine_requests(fleet)
        assert [(await _chat(oc, model, **v))[0] for v in variants] == ["MISS"] * 4
        assert engine_requests(fleet) == before + 4
        assert [(await _chat(oc, model, **v))[0] for v in variants] == ["HIT"] * 4
        assert engine_requests(fleet) == before + 4


async def test_a_hit_never_counts_in_routing_metrics(fleet: SimFleet) -> None:
    model = fleet.endpoints[0].model
    async with running_ingress(cache_config(fleet.router_backends())) as ing, _openai(ing.url) as oc:
        await _chat(oc, model)
        routed = await metric(ing.url, "continuum_prefix_routing_requests_total", strategy="prefix_hash")
        backend_calls = sum(
            [
                await metric(ing.url, "continuum_backend_requests_total", backend=b, outcome="success")
                for b in ("sim-0", "sim-1")
            ]
        )
        assert routed == 1 and backend_calls == 1
        for _ in range(3):
            assert (await _chat(oc, model))[0] == "HIT"
        assert await metric(ing.url, "continuum_prefix_routing_requests_total", strategy="prefix_hash") == 1
        assert (
            sum(
                [
                    await metric(ing.url, "continuum_backend_requests_total", backend=b, outcome="success")
                    for b in ("sim-0", "sim-1")
                ]
            )
            == 1
        )
        async with httpx.AsyncClient(base_url=ing.url, headers=ADMIN) as admin:
            prefix_stats = (await admin.get("/admin/prefix-routing/stats")).json()
        assert prefix_stats["routing_decisions"]["total"] == 1


async def test_admin_stats_and_invalidate(fleet: SimFleet, redis_server: RedisServer) -> None:
    model = fleet.endpoints[0].model
    async with (
        running_ingress(cache_config(fleet.router_backends(), **_store("redis", redis_server))) as ing,
        _openai(ing.url) as oc,
    ):
        await _chat(oc, model)
        await wait_entries(ing.url, 1)
        await _chat(oc, model)
        async with httpx.AsyncClient(base_url=ing.url) as client:
            assert (await client.get("/admin/response-cache/stats")).status_code == 401
            assert (await client.post("/admin/response-cache/invalidate", json={"clear_all": True})).status_code == 401
            stats = (await client.get("/admin/response-cache/stats", headers=ADMIN)).json()
            assert stats["enabled"] is True and stats["backend_type"] == "redis" and stats["entries"] == 1
            assert stats["requests"] == {"hit": 1, "miss": 1, "skip": 0, "total": 2}
            assert stats["hit_rate"] == "0.5000"
            assert stats["redis"]["fallback_active"] is False and stats["redis"]["mode"] == "redis"
            assert set(stats["config"]) == {"backend", "ttl", "capacity", "max_response_size", "max_stream_buffer_size"}

            for bad in ({"clear_all": False}, {"prefix": "x"}, [1]):
                refused = await client.post("/admin/response-cache/invalidate", json=bad, headers=ADMIN)
                assert refused.status_code == 400
                error = refused.json()["error"]
                assert error["type"] == "invalid_request_error" and error["message"]
            garbled = await client.post("/admin/response-cache/invalidate", content=b"{", headers=ADMIN)
            assert garbled.status_code == 400 and garbled.json()["error"]["code"] == "invalid_json"

            done = await client.post("/admin/response-cache/invalidate", json={"clear_all": True}, headers=ADMIN)
            assert done.json() == {"success": True, "action": "clear_all", "cleared_entries": 1}
            exposition = (await client.get("/metrics")).text
        for family in (
            "continuum_response_cache_requests_total counter",
            "continuum_cache_redis_latency_seconds histogram",
            "continuum_cache_redis_errors_total counter",
            "continuum_cache_fallback_active gauge",
        ):
            assert exposition.count(f"# TYPE {family}\n") == 1, family
        assert 'continuum_response_cache_requests_total{result="hit"} 1.0' in exposition
        assert (await _chat(oc, model))[0] == "MISS"
