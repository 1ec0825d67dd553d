"""The ResponseCache facade over the in-memory store: the request-path contract the ingress
relies on (lookup → HIT/MISS/BYPASS, store, stream recording, stats, invalidate, reload)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig, parse
from continuum_ingress.cache import (
    CacheRequest,
    CacheStatus,
    InMemoryCacheStore,
    InvalidateRequestError,
    ResponseCache,
    Route,
    build_response_cache,
)
from continuum_ingress.cache.facade import MAX_LATE_COMMITS
from tests.unit.test_cache_sse import anthropic_stream, openai_stream, random_chunks

KEY_A = {"authorization": "Bearer sk-tenant-a"}
KEY_B = {"authorization": "Bearer sk-tenant-b"}
JSON = {"content-type": "application/json", "x-request-id": "r1"}
SSE = {"content-type": "text/event-stream"}


def config(**response_cache: Any) -> RouterConfig:
    return parse(RouterConfig, {"response_cache": {"enabled": True, **response_cache}})


def make(registry: CollectorRegistry | None = None, **response_cache: Any) -> ResponseCache:
    return build_response_cache(config(**response_cache), registry=registry or CollectorRegistry())


def chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def req(body: dict[str, Any], headers: dict[str, str] = KEY_A, route: str = Route.CHAT) -> CacheRequest:
    return CacheRequest(route=route, body=body, headers=headers)


BODY = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"message": {"content": "Hi"}}]})


async def test_miss_then_hit_for_a_whole_response() -> None:
    registry = CollectorRegistry()
    cache = make(registry)
    first = await cache.lookup(req(chat()))
    assert first.status is CacheStatus.MISS and first.headers == {"X-Cache": "MISS"} and first.response is None
    assert await cache.store(first, status=200, headers=JSON, body=BODY)
    second = await cache.lookup(req(chat()))
    assert second.status is CacheStatus.HIT and second.headers == {"X-Cache": "HIT"}
    assert second.response is not None and second.response.body == BODY and second.response.status == 200
    assert second.response.headers == (("content-type", "application/json"),)
    sample = registry.get_sample_value
    assert sample("continuum_response_cache_requests_total", {"result": "hit"}) == 1
    assert sample("continuum_response_cache_requests_total", {"result": "miss"}) == 1
    assert sample("continuum_response_cache_requests_total", {"result": "skip"}) == 0


async def test_bypass_for_temperature_and_nothing_when_disabled() -> None:
    cache = make()
    hot = await cache.lookup(req(chat(temperature=0.8)))
    assert hot.status is CacheStatus.BYPASS and hot.headers == {"X-Cache": "BYPASS"} and hot.reason == "temperature"
    assert not await cache.store(hot, status=200, headers=JSON, body=BODY)
    assert cache.counts == {"hit": 0, "miss": 0, "skip": 1}
    off = make(enabled=False)
    looked = await off.lookup(req(chat()))
    assert looked.status is CacheStatus.OFF and looked.headers == {} and off.counts["skip"] == 0


async def test_an_omitted_temperature_is_cached_only_when_configured() -> None:
    omitted = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    looked = await make().lookup(req(omitted))
    assert looked.status is CacheStatus.BYPASS and looked.reason == "temperature"
    cache = make(cache_omitted_temperature=True)
    first = await cache.lookup(req(omitted))
    assert first.status is CacheStatus.MISS
    assert await cache.store(first, status=200, headers=JSON, body=BODY)
    assert (await cache.lookup(req(omitted))).status is CacheStatus.HIT
    # an explicit 0 is another entry
    assert (await cache.lookup(req(chat()))).status is CacheStatus.MISS


async def test_unkeyable_body_bypasses() -> None:
    cache = make()
    looked = await cache.lookup(req({"messages": [], "temperature": 0}))
    assert looked.status is CacheStatus.BYPASS and looked.reason == "unkeyable"


async def test_non_200_and_oversized_responses_are_not_stored() -> None:
    cache = make(max_response_size=len(BODY))
    miss = await cache.lookup(req(chat()))
    assert not await cache.store(miss, status=500, headers=JSON, body=b"{}")
    assert not await cache.store(miss, status=200, headers=JSON, body=BODY + b" ")
    assert (await cache.lookup(req(chat()))).status is CacheStatus.MISS
    assert await cache.store(miss, status=200, headers=JSON, body=BODY)


async def test_tenants_are_isolated() -> None:
    cache = make()
    miss = await cache.lookup(req(chat(), KEY_A))
    await cache.store(miss, status=200, headers=JSON, body=BODY)
    assert (await cache.lookup(req(chat(), KEY_B))).status is CacheStatus.MISS
    assert (await cache.lookup(req(chat(), {}))).status is CacheStatus.MISS
    assert (await cache.lookup(req(chat(), KEY_A))).status is CacheStatus.HIT


@pytest.mark.parametrize("field", ["tools", "response_format", "stop", "seed"])
async def test_output_fields_do_not_collide(field: str) -> None:
    values = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "response_format": {"type": "json_object"},
        "stop": ["END"],
        "seed": 42,
    }
    cache = make()
    miss = await cache.lookup(req(chat()))
    await cache.store(miss, status=200, headers=JSON, body=BODY)
    assert (await cache.lookup(req(chat(**{field: values[field]})))).status is CacheStatus.MISS


@pytest.mark.parametrize(
    ("route", "stream"),
    [(Route.CHAT, openai_stream(["Hel", "lo"])), (Route.ANTHROPIC, anthropic_stream(["Hel", "lo"]))],
)
async def test_stream_miss_records_then_hit_replays_identically(route: str, stream: bytes) -> None:
    cache = make()
    body = chat(stream=True, max_tokens=20)
    miss = await cache.lookup(req(body, route=route))
    assert miss.status is CacheStatus.MISS and miss.stream
    rec = cache.recorder(miss)
    assert rec is not None
    for chunk in random_chunks(stream, random.Random(0)):
        rec.feed(chunk)
    assert await rec.commit(200, SSE)
    assert not await rec.commit(200, SSE)  # once only
    hit = await cache.lookup(req(body, route=route))
    assert hit.status is CacheStatus.HIT and hit.response is not None and hit.response.is_stream
    assert b"".join(hit.response.chunks()) == stream
    assert hit.response.headers == (("content-type", "text/event-stream"),)
    # A stream entry never answers the non-stream request, nor the other way round.
    assert (await cache.lookup(req(chat(max_tokens=20), route=route))).status is CacheStatus.MISS


async def test_stream_with_an_error_status_is_not_stored() -> None:
    cache = make()
    miss = await cache.lookup(req(chat(stream=True)))
    rec = cache.recorder(miss)
    assert rec is not None
    rec.feed(openai_stream(["a"]))
    assert not await rec.commit(500, SSE)
    assert (await cache.lookup(req(chat(stream=True)))).status is CacheStatus.MISS


async def test_interrupted_and_oversized_streams_are_not_cached() -> None:
    stream = openai_stream(["a", "b"])
    cache = make(max_stream_buffer_size=len(stream) - 1)
    body = chat(stream=True)
    miss = await cache.lookup(req(body))
    rec = cache.recorder(miss)
    assert rec is not None
    rec.feed(stream)
    assert not await rec.commit(200, SSE)  # oversized
    cache2 = make()
    miss2 = await cache2.lookup(req(body))
    rec2 = cache2.recorder(miss2)
    assert rec2 is not None
    rec2.feed(stream[: len(stream) // 2])
    rec2.abort()  # client disconnected
    assert not await rec2.commit(200, SSE)
    rec3 = cache2.recorder(miss2)
    assert rec3 is not None
    rec3.feed(stream[: len(stream) // 2])
    assert not await rec3.commit(200, SSE)  # upstream ended without [DONE]
    assert (await cache2.lookup(req(body))).status is CacheStatus.MISS


async def test_a_stream_whose_client_left_after_the_terminal_event_is_stored_in_the_background() -> None:
    registry = CollectorRegistry()
    cache = make(registry)
    stream = openai_stream(["a", "b"])
    late = registry.get_sample_value

    async def abandoned(text: str, fed: bytes, status: int = 200) -> CacheStatus:
        body = chat(text, stream=True)
        rec = cache.recorder(await cache.lookup(req(body)))
        assert rec is not None
        rec.feed(fed)
        rec.abandon(status, list(SSE.items()))
        await asyncio.sleep(0)  # the background store
        await asyncio.sleep(0)
        return (await cache.lookup(req(body))).status

    assert await abandoned("whole", stream) is CacheStatus.HIT
    assert late("continuum_response_cache_late_commits_total", {"outcome": "stored"}) == 1
    assert await abandoned("cut", stream[: len(stream) // 2]) is CacheStatus.MISS  # no [DONE] yet: forgotten
    assert await abandoned("refused", stream, status=429) is CacheStatus.MISS
    assert late("continuum_response_cache_late_commits_total", {"outcome": "stored"}) == 1

    # Beyond MAX_LATE_COMMITS pending stores, the answer is not stored, and that is counted.
    recs = []
    for i in range(MAX_LATE_COMMITS + 1):
        rec = cache.recorder(await cache.lookup(req(chat(f"burst {i}", stream=True))))
        assert rec is not None
        rec.feed(stream)
        recs.append(rec)
    for rec in recs:
        rec.abandon(200, list(SSE.items()))
    assert late("continuum_response_cache_late_commits_total", {"outcome": "skipped"}) == 1
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert late("continuum_response_cache_late_commits_total", {"outcome": "stored"}) == 1 + MAX_LATE_COMMITS


async def test_closing_the_cache_finishes_the_late_stores_first() -> None:
    registry = CollectorRegistry()
    cache = make(registry)
    body = chat("closing", stream=True)
    rec = cache.recorder(await cache.lookup(req(body)))
    assert rec is not None
    rec.feed(openai_stream(["a"]))
    rec.abandon(200, list(SSE.items()))
    await cache.aclose()  # no loop turn in between: aclose itself waits for the store
    assert registry.get_sample_value("continuum_response_cache_late_commits_total", {"outcome": "stored"}) == 1
    assert (await cache.lookup(req(body))).status is CacheStatus.HIT


async def test_whole_bodies_can_be_recorded_chunk_by_chunk() -> None:
    cache = make(max_response_size=len(BODY))
    miss = await cache.lookup(req(chat()))
    rec = cache.recorder(miss)
    assert rec is not None and rec.stream is None
    for i in range(0, len(BODY), 7):
        rec.feed(BODY[i : i + 7])
    assert await rec.commit(200, JSON)
    hit = await cache.lookup(req(chat()))
    assert hit.response is not None and hit.response.body == BODY
    big = cache.recorder(await cache.lookup(req(chat("other"))))
    assert big is not None
    big.feed(BODY)
    big.feed(b" ")
    assert not await big.commit(200, JSON) and big.failure == "oversized"
    assert cache.recorder(await cache.lookup(req(chat(temperature=1)))) is None  # BYPASS: nothing to record


async def test_stream_not_recorded_when_buffering_off() -> None:
    cache = make(stream_buffering=False)
    looked = await cache.lookup(req(chat(stream=True)))
    assert looked.status is CacheStatus.BYPASS and cache.recorder(looked) is None


async def test_stats_document_has_the_seed_shape() -> None:
    cache = make(capacity=50, ttl="30m")
    miss = await cache.lookup(req(chat()))
    await cache.store(miss, status=200, headers=JSON, body=BODY)
    await cache.lookup(req(chat()))
    await cache.lookup(req(chat(temperature=1)))
    stats = await cache.stats()
    assert stats == {
        "enabled": True,
        "backend_type": "memory",
        "entries": 1,
        "capacity": 50,
        "requests": {"hit": 1, "miss": 1, "skip": 1, "total": 3},
        "hit_rate": "0.5000",
        "evictions": 0,
        "size_bytes": stats["size_bytes"],
        "config": {
            "backend": "memory",
            "ttl": "30m",
            "capacity": 50,
            "max_response_size": 1048576,
            "max_stream_buffer_size": 10485760,
        },
    }
    assert stats["size_bytes"] > len(BODY)


async def test_invalidate_clears_everything_and_validates_its_body() -> None:
    cache = make()
    for text in ("a", "b", "c"):
        miss = await cache.lookup(req(chat(text)))
        await cache.store(miss, status=200, headers=JSON, body=BODY)
    assert await cache.invalidate({"clear_all": True}) == {"success": True, "action": "clear_all", "cleared_entries": 3}
    assert (await cache.lookup(req(chat("a")))).status is CacheStatus.MISS
    for bad in ({}, {"clear_all": False}, {"clear_all": "yes"}, {"clear_all": True, "prefix": "x"}, [1]):
        with pytest.raises(InvalidateRequestError):
            await cache.invalidate(bad)


async def test_hot_reload_applies_everything_but_backend() -> None:
    cache = make(capacity=10)
    for i in range(5):
        miss = await cache.lookup(req(chat(str(i))))
        await cache.store(miss, status=200, headers=JSON, body=BODY)
    cache.reload(config(capacity=2, ttl="1m", max_response_size=10, backend="redis", redis={"url": "redis://h:1"}))
    assert cache.backend == "memory" and cache.capacity == 2 and cache.policy.ttl == 60
    assert isinstance(cache.cache_store, InMemoryCacheStore) and len(cache.cache_store) == 2
    miss = await cache.lookup(req(chat("new")))
    assert not await cache.store(miss, status=200, headers=JSON, body=BODY)  # now over max_response_size
    cache.reload(config(enabled=False))
    assert (await cache.lookup(req(chat("4")))).status is CacheStatus.OFF


async def test_metrics_register_on_the_given_registry_only() -> None:
    registry = CollectorRegistry()
    make(registry)
    with pytest.raises(ValueError):  # the same registry cannot hold two caches' metrics
        make(registry)
    assert registry.get_sample_value("continuum_cache_fallback_active") == 0
