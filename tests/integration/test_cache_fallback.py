"""Tier 3 automatic fallback on real outages: Redis killed mid-run, a Redis that stops
answering (timeouts), bypass mode, switch-back by the monitor, invalidation during an outage."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from continuum_common.config import RouterConfig, parse
from continuum_common.config.router import Redis
from continuum_common.procs import RedisServer, free_port
from continuum_common.redis_client import make_redis
from continuum_ingress.cache import CacheRequest, CacheStatus, ResponseCache, Route, build_response_cache
from continuum_ingress.cache.adapters.redis_store import RedisCacheStore
from continuum_ingress.cache.errors import BackendErrorKind, CacheBackendError

MONITOR_S = 0.2
JSON = {"content-type": "application/json"}
HEADERS = {"authorization": "Bearer sk-fallback"}


def body_of(text: str) -> bytes:
    return orjson.dumps({"object": "chat.completion", "choices": [{"message": {"content": text}}]})


def request(text: str) -> CacheRequest:
    return CacheRequest(
        Route.CHAT, {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}, HEADERS
    )


def build(url: str, registry: CollectorRegistry, **redis_opts: Any) -> ResponseCache:
    cfg = parse(
        RouterConfig,
        {
            "redis": {"url": url, "connect_timeout_ms": 300, "command_timeout_ms": 300},
            "response_cache": {"enabled": True, "backend": "redis", "redis": {"url": url, **redis_opts}},
        },
    )
    return build_response_cache(cfg, registry=registry, monitor_interval_s=MONITOR_S)


async def serve(cache: ResponseCache, text: str) -> CacheStatus:
    """What the ingress does for one request: lookup, and store on a miss. Must never raise."""
    looked = await cache.lookup(request(text))
    if looked.status is CacheStatus.MISS:
        await cache.store(looked, status=200, headers=JSON, body=body_of(text))
    return looked.status


async def eventually(check: Callable[[], Awaitable[bool]], within: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if await check():
            return time.monotonic() - start
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {within}s")


async def test_redis_killed_mid_run_falls_back_then_switches_back(fresh_redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    gauge = lambda: registry.get_sample_value("continuum_cache_fallback_active")  # noqa: E731
    raw = aioredis.Redis(host=fresh_redis_server.host, port=fresh_redis_server.port)
    async with build(fresh_redis_server.url, registry) as cache:
        assert await serve(cache, "before") is CacheStatus.MISS
        assert await serve(cache, "before") is CacheStatus.HIT
        assert gauge() == 0

        await fresh_redis_server.kill()
        # Requests keep succeeding: the first one notices the outage and misses ...
        assert await serve(cache, "before") is CacheStatus.MISS
        assert gauge() == 1
        stats = await cache.stats()
        assert stats["redis"]["fallback_active"] is True and stats["redis"]["mode"] == "memory"
        assert stats["redis"]["errors"]["connection"] >= 1
        # ... and from then on the in-memory fallback serves misses and hits.
        assert await serve(cache, "during") is CacheStatus.MISS
        assert await serve(cache, "during") is CacheStatus.HIT
        assert (await cache.stats())["redis"]["fallback_entries"] == 2

        await fresh_redis_server.start()  # same port, empty (not persisted)

        async def back() -> bool:
            return gauge() == 0

        waited = await eventually(back, within=5)
        assert waited < 2 * MONITOR_S + 1.0
        stats = await cache.stats()
        assert stats["redis"]["fallback_active"] is False and stats["redis"]["fallback_entries"] == 0
        # Writes go to Redis again.
        assert await serve(cache, "after") is CacheStatus.MISS
        assert await raw.dbsize() == 1
        assert await serve(cache, "after") is CacheStatus.HIT
    await raw.aclose()


async def test_bypass_mode_serves_misses_and_never_fails(fresh_redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    async with build(fresh_redis_server.url, registry, fallback_to_memory=False) as cache:
        assert await serve(cache, "q") is CacheStatus.MISS
        await fresh_redis_server.kill()
        for _ in range(3):
            assert await serve(cache, "q") is CacheStatus.MISS  # nothing is kept while bypassing
        assert registry.get_sample_value("continuum_cache_fallback_active") == 1
        assert (await cache.stats())["redis"]["mode"] == "bypass"
        await fresh_redis_server.start()

        async def recovered() -> bool:
            return registry.get_sample_value("continuum_cache_fallback_active") == 0

        await eventually(recovered, within=5)
        assert await serve(cache, "q") is CacheStatus.MISS
        assert await serve(cache, "q") is CacheStatus.HIT


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts connections and never answers: a hung Redis."""
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the client gives up

    port = free_port()
    server = await asyncio.start_server(hold, "127.0.0.1", port)
    try:
        yield port
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_hung_redis_times_out_and_falls_back() -> None:
    async with silent_server() as port:
        url = f"redis://127.0.0.1:{port}"
        client = make_redis(Redis(url=url, connect_timeout_ms=200, command_timeout_ms=200))
        store = RedisCacheStore(client, deadline_s=0.4)
        started = time.monotonic()
        with pytest.raises(CacheBackendError) as caught:
            await store.get("k")
        assert caught.value.kind is BackendErrorKind.TIMEOUT and caught.value.is_outage
        assert time.monotonic() - started < 1.5
        await client.aclose()

        registry = CollectorRegistry()
        async with build(url, registry) as cache:
            started = time.monotonic()
            assert await serve(cache, "q") is CacheStatus.MISS
            assert time.monotonic() - started < 2.0
            assert registry.get_sample_value("continuum_cache_fallback_active") == 1
            assert (await cache.stats())["redis"]["errors"]["timeout"] >= 1
            assert await serve(cache, "q") is CacheStatus.HIT  # from memory, no more waiting


async def test_invalidate_during_an_outage_clears_redis_before_switching_back() -> None:
    # A persisted Redis, so entries written before the outage survive the restart.
    server = RedisServer(persist=True, extra_args=["--appendfsync", "always"])
    await server.start()
    try:
        registry = CollectorRegistry()
        raw = aioredis.Redis(host=server.host, port=server.port)
        async with build(server.url, registry) as cache:
            await serve(cache, "old")
            assert await serve(cache, "old") is CacheStatus.HIT
            assert await raw.dbsize() == 1
            await server.kill()
            result = await cache.invalidate_all()
            assert result["success"] is False and result["action"] == "clear_all" and "error" in result
            await server.start()
            assert await raw.dbsize() == 1  # the old entry came back with the restart ...

            async def recovered() -> bool:
                return registry.get_sample_value("continuum_cache_fallback_active") == 0

            await eventually(recovered, within=5)
            assert await raw.dbsize() == 0  # ... and was cleared before Redis served again
            assert await serve(cache, "old") is CacheStatus.MISS
        await raw.aclose()
    finally:
        await server.close()


async def test_monitor_stops_with_its_owner(fresh_redis_server: RedisServer) -> None:
    cache = build(fresh_redis_server.url, CollectorRegistry())
    cache.start()
    tasks = [t for t in asyncio.all_tasks() if t.get_name() == "response-cache-redis-monitor"]
    assert len(tasks) == 1
    await cache.aclose()
    assert tasks[0].done()


async def test_redis_down_from_the_start_serves_from_memory() -> None:
    registry = CollectorRegistry()
    async with build(f"redis://127.0.0.1:{free_port()}", registry) as cache:
        assert await serve(cache, "q") is CacheStatus.MISS
        assert await serve(cache, "q") is CacheStatus.HIT
        assert registry.get_sample_value("continuum_cache_fallback_active") == 1
        assert registry.get_sample_value("continuum_cache_redis_errors_total") >= 1
        stats = await cache.stats()
        assert stats["entries"] == 1 and stats["redis"]["mode"] == "memory"
        result = await cache.invalidate_all()
        assert result["success"] is False and result["cleared_entries"] == 1
        assert await serve(cache, "q") is CacheStatus.MISS
