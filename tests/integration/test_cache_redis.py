"""RedisCacheStore and the ResponseCache on a real redis-server: key layout, SET EX, prefix-only
clear, shared entries between two ingress processes, pool behaviour under concurrency."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig, parse
from continuum_common.config.router import Redis
from continuum_common.procs import RedisServer
from continuum_common.redis_client import make_redis
from continuum_ingress.cache import CacheRequest, CacheStatus, Route, build_response_cache
from continuum_ingress.cache.adapters.redis_store import RedisCacheStore
from continuum_ingress.cache.metrics import CacheMetrics
from tests.unit.test_cache_sse import anthropic_stream, openai_stream

JSON = {"content-type": "application/json"}
BODY = orjson.dumps({"id": "chatcmpl-9", "object": "chat.completion", "choices": [{"message": {"content": "cached"}}]})


def redis_config(server: RedisServer, **response_cache: Any) -> RouterConfig:
    return parse(
        RouterConfig,
        {"redis": {"url": server.url}, "response_cache": {"enabled": True, "backend": "redis", **response_cache}},
    )


@pytest_asyncio.fixture(loop_scope="session")
async def raw(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(host=redis_server.host, port=redis_server.port)
    yield client
    await client.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def store(redis_server: RedisServer) -> AsyncIterator[RedisCacheStore]:
    client = make_redis(Redis(url=redis_server.url))
    yield RedisCacheStore(client, metrics=CacheMetrics(CollectorRegistry()))
    await client.aclose()


async def test_set_get_delete_with_prefixed_keys_and_ttl(store: RedisCacheStore, raw: aioredis.Redis) -> None:
    key = "a" * 64
    await store.set(key, b"\x00value\xff", 1.2)
    assert await raw.get(f"cr:resp:{key}") == b"\x00value\xff"
    assert 1 <= await raw.ttl(f"cr:resp:{key}") <= 2  # SET EX, rounded up to whole seconds
    assert await store.get(key) == b"\x00value\xff"
    await store.set("sem:" + "b" * 64, b"sem", 300)
    assert 295 <= await raw.ttl("cr:resp:sem:" + "b" * 64) <= 300
    await store.delete(key)
    assert await store.get(key) is None and await raw.exists(f"cr:resp:{key}") == 0


async def test_clear_and_stats_touch_only_their_own_prefix(store: RedisCacheStore, raw: aioredis.Redis) -> None:
    pipe = raw.pipeline(transaction=False)
    for i in range(1203):  # more than two delete batches
        pipe.set(f"cr:resp:{i:064x}", b"v", ex=60)
    for other in ("cr:kvidx:abc", "cr:respX", "cr:res", "other:cr:resp:1", "cr:gem:1"):
        pipe.set(other, b"keep")
    await pipe.execute()
    assert (await store.stats()).entries == 1203
    assert await store.clear() == 1203
    assert sorted(await raw.keys("*")) == sorted(
        k.encode() for k in ("cr:kvidx:abc", "cr:respX", "cr:res", "other:cr:resp:1", "cr:gem:1")
    )


async def test_clear_with_a_custom_prefix(redis_server: RedisServer, raw: aioredis.Redis) -> None:
    client = make_redis(Redis(url=redis_server.url))
    try:
        mine = RedisCacheStore(client, key_prefix="team-a/resp:")
        await mine.set("k1", b"1", 60)
        await raw.set("team-a/respX", b"keep")
        await raw.set("cr:resp:k1", b"keep")
        assert await mine.clear() == 1
        assert await raw.exists("team-a/respX", "cr:resp:k1") == 2
    finally:
        await client.aclose()


async def test_latency_metric_is_recorded(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    client = make_redis(Redis(url=redis_server.url))
    try:
        s = RedisCacheStore(client, metrics=CacheMetrics(registry))
        await s.set("k", b"v", 10)
        await s.get("k")
        await s.get("missing")
        count = registry.get_sample_value("continuum_cache_redis_latency_seconds_count", {"operation": "get"})
        assert count == 2
        assert registry.get_sample_value("continuum_cache_redis_latency_seconds_count", {"operation": "set"}) == 1
        assert registry.get_sample_value("continuum_cache_redis_errors_total") == 0
    finally:
        await client.aclose()


async def test_more_concurrent_commands_than_pool_connections_wait_instead_of_failing(
    redis_server: RedisServer,
) -> None:
    client = make_redis(Redis(url=redis_server.url, pool_size=2))
    try:
        s = RedisCacheStore(client)
        await s.set("k", b"v", 10)
        results = await asyncio.gather(*(s.get("k") for _ in range(64)))
        assert results == [b"v"] * 64
        assert s.errors == {k: 0 for k in s.errors}
    finally:
        await client.aclose()


def chat(stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "shared?"}], "temperature": 0, "stream": stream}


HEADERS = {"authorization": "Bearer sk-shared"}


async def test_response_cache_on_redis_miss_then_hit_and_foreign_data(
    redis_server: RedisServer, raw: aioredis.Redis
) -> None:
    cache = build_response_cache(redis_config(redis_server), registry=CollectorRegistry())
    async with cache:
        miss = await cache.lookup(CacheRequest(Route.CHAT, chat(), HEADERS))
        assert miss.status is CacheStatus.MISS and miss.key is not None
        assert await cache.store(miss, status=200, headers=JSON, body=BODY)
        assert await raw.exists(f"cr:resp:{miss.key}") == 1
        hit = await cache.lookup(CacheRequest(Route.CHAT, chat(), HEADERS))
        assert hit.status is CacheStatus.HIT and hit.response is not None and hit.response.body == BODY
        await raw.set(f"cr:resp:{miss.key}", b"garbage from someone else")
        assert (await cache.lookup(CacheRequest(Route.CHAT, chat(), HEADERS))).status is CacheStatus.MISS
        stats = await cache.stats()
        assert stats["backend_type"] == "redis" and stats["entries"] == 1
        assert stats["redis"]["fallback_active"] is False
        assert stats["redis"]["errors"] == {"connection": 0, "timeout": 0, "other": 0}
        assert set(stats["redis"]["connections"]) == {"active", "idle"}
        assert await cache.invalidate_all() == {"success": True, "action": "clear_all", "cleared_entries": 1}


_READER = """
import asyncio, json, sys
from prometheus_client import CollectorRegistry
from continuum_common.config import RouterConfig, parse
from continuum_ingress.cache import CacheRequest, build_response_cache

async def main():
    url, route, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    cfg = parse(RouterConfig, {"redis": {"url": url}, "response_cache": {"enabled": True, "backend": "redis"}})
    async with build_response_cache(cfg, registry=CollectorRegistry()) as cache:
        found = await cache.lookup(CacheRequest(route, body, {"authorization": "Bearer sk-shared"}))
        chunks = list(found.response.chunks()) if found.response else []
        print(json.dumps({"status": found.status.value, "body": b"".join(chunks).decode()}))

asyncio.run(main())
"""


async def _lookup_in_another_process(url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _READER,
        url,
        route,
        json.dumps(body),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.mark.parametrize(
    ("route", "stream"),
    [(Route.CHAT, None), (Route.CHAT, openai_stream(["sha", "red"])), (Route.ANTHROPIC, anthropic_stream(["x"]))],
)
async def test_a_second_ingress_process_answers_a_hit(
    redis_server: RedisServer, route: str, stream: bytes | None
) -> None:
    body = chat(stream=stream is not None)
    before = await _lookup_in_another_process(redis_server.url, route, body)
    assert before["status"] == "MISS"
    cache = build_response_cache(redis_config(redis_server), registry=CollectorRegistry())
    async with cache:
        miss = await cache.lookup(CacheRequest(route, body, HEADERS))
        if stream is None:
            assert await cache.store(miss, status=200, headers=JSON, body=BODY)
        else:
            rec = cache.recorder(miss)
            assert rec is not None
            rec.feed(stream)
            assert await rec.commit(200, {"content-type": "text/event-stream"})
    after = await _lookup_in_another_process(redis_server.url, route, body)
    assert after == {"status": "HIT", "body": (stream or BODY).decode()}
