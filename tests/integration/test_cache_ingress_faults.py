"""The response cache in the ingress when things go wrong: streams cut off by the upstream or by
the client are never stored, oversized answers are not stored, Redis dies mid-run (fallback to
memory, gauge 1, switch back when it returns), and hot reload of the cache and of the shared
Redis connection. Real uvicorn, real redis-server, the ingress's test upstream (which can break
a stream or stall between chunks) and the official `openai` SDK."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis
import yaml

from continuum_common.procs import RedisServer
from continuum_testing.cache_support import ADMIN_ENV, ADMIN_TOKEN, cache_config, cache_stats, metric, wait_entries
from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


def _openai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key="sk-tenant-a", base_url=f"{url}/v1", max_retries=0, timeout=10)


async def _x_cache(oc: openai.AsyncOpenAI, *, stream: bool = False) -> str | None:
    if not stream:
        raw = await oc.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, temperature=0)
        raw.parse()
        return raw.headers.get("x-cache")
    async with oc.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, temperature=0, stream=True
    ) as r:
        async for _ in r.iter_bytes():
            pass
        return r.headers.get("x-cache")


@contextlib.asynccontextmanager
async def _raw_stream(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[httpx.Response]:
    """A streamed chat completion read (and left) by hand, without the SDK."""
    body = {"model": "m", "messages": MESSAGES, "temperature": 0, "stream": True}
    async with (
        httpx.AsyncClient(base_url=url) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        yield r


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.02)


async def test_interrupted_streams_are_not_cached() -> None:
    async with running_stubs("a") as stubs:
        stub = stubs[0].stub
        async with running_ingress(cache_config(stub_backends(stubs))) as ing, _openai(ing.url) as oc:
            # The upstream breaks off after two events: the client gets an in-band error.
            stub.break_stream_after = 2
            with pytest.raises(openai.APIError):
                async for _ in await oc.chat.completions.create(
                    model="m", messages=MESSAGES, temperature=0, stream=True
                ):
                    pass
            stub.break_stream_after = None
            # The client goes away after the first chunk.
            stub.chunk_delay = 0.2
            async with _raw_stream(ing.url) as r:
                assert r.headers["x-cache"] == "MISS"
                async for _ in r.aiter_bytes():
                    break

            async def cancelled() -> bool:
                return stub.cancelled == 1

            await _until(cancelled)
            stub.chunk_delay = 0
            assert (await cache_stats(ing.url))["entries"] == 0
            assert await _x_cache(oc, stream=True) == "MISS"  # neither was stored
            await wait_entries(ing.url, 1)
            assert await _x_cache(oc, stream=True) == "HIT"
            assert len(stub.requests) == 3


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_stream_whose_client_closed_on_done_is_stored(backend: str, redis_server: RedisServer) -> None:
    # Clients often close the connection on `data: [DONE]`, before the upstream's end of body
    # reaches the ingress (here the upstream waits 2 s after its last event).
    async with running_stubs("a") as stubs:
        stub = stubs[0].stub
        stub.end_delay = 2.0
        store: dict[str, Any] = {"backend": "redis", "redis": {"url": redis_server.url}} if backend == "redis" else {}
        async with running_ingress(cache_config(stub_backends(stubs), **store)) as ing, _openai(ing.url) as oc:
            async with _raw_stream(ing.url, headers={"authorization": "Bearer sk-tenant-a"}) as r:
                assert r.headers["x-cache"] == "MISS"
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        break

            async def cancelled() -> bool:
                return stub.cancelled == 1

            await _until(cancelled)
            await wait_entries(ing.url, 1)
            stub.end_delay = 0
            assert await _x_cache(oc, stream=True) == "HIT"
            assert len(stub.requests) == 1
            assert await metric(ing.url, "continuum_response_cache_late_commits_total", outcome="stored") == 1


async def test_oversized_answers_are_served_but_not_stored() -> None:
    async with running_stubs("a") as stubs:
        cfg = cache_config(stub_backends(stubs), max_response_size=64, max_stream_buffer_size=200)
        async with running_ingress(cfg) as ing, _openai(ing.url) as oc:
            assert [await _x_cache(oc) for _ in range(2)] == ["MISS", "MISS"]
            assert [await _x_cache(oc, stream=True) for _ in range(2)] == ["MISS", "MISS"]
            assert len(stubs[0].stub.requests) == 4


async def test_redis_killed_mid_run_falls_back_and_comes_back(fresh_redis_server: RedisServer) -> None:
    redis_cfg = {"url": fresh_redis_server.url, "connect_timeout_ms": 300, "command_timeout_ms": 300}
    async with running_stubs("a") as stubs:
        cfg = cache_config(stub_backends(stubs), backend="redis", redis=redis_cfg)
        async with running_ingress(cfg, cache_monitor_interval_s=0.2) as ing, _openai(ing.url) as oc:
            assert await _x_cache(oc) == "MISS"
            await wait_entries(ing.url, 1)
            assert await _x_cache(oc) == "HIT"

            await fresh_redis_server.kill()
            # Requests keep succeeding: the outage turns into a miss, then memory serves.
            assert await _x_cache(oc) == "MISS"
            assert await metric(ing.url, "continuum_cache_fallback_active") == 1
            assert await _x_cache(oc) == "HIT"
            stats = await cache_stats(ing.url)
            assert stats["redis"]["fallback_active"] is True and stats["redis"]["mode"] == "memory"
            assert stats["redis"]["errors"]["connection"] >= 1
            assert await metric(ing.url, "continuum_cache_redis_errors_total") >= 1

            await fresh_redis_server.start()  # same port, empty

            async def back_on_redis() -> bool:
                return await metric(ing.url, "continuum_cache_fallback_active") == 0

            await _until(back_on_redis, timeout=3.0)
            # The fallback's entries were dropped; new entries go to Redis again.
            assert await _x_cache(oc) == "MISS"
            await wait_entries(ing.url, 1)
            client = aioredis.Redis(host=fresh_redis_server.host, port=fresh_redis_server.port)
            try:
                assert len(await client.keys("cr:resp:*")) == 1
            finally:
                await client.aclose()
            assert await _x_cache(oc) == "HIT"
            assert len(stubs[0].stub.requests) == 3


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data))


async def test_hot_reload_of_cache_fields_and_redis_connection(
    tmp_path: Path, redis_server: RedisServer, fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "router.yaml"
    async with running_stubs("a") as stubs:
        backends = stub_backends(stubs)
        _write(path, cache_config(backends, backend="redis", redis={"url": redis_server.url}))
        async with running_ingress(path, reload_interval=0) as ing, _openai(ing.url) as oc:
            assert await _x_cache(oc) == "MISS"
            await wait_entries(ing.url, 1)
            assert await _x_cache(oc) == "HIT"

            # Another Redis: a new shared client, the entry is not there.
            _write(path, cache_config(backends, backend="redis", redis={"url": fresh_redis_server.url}))
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                assert ing.app.reload()
            assert not [r for r in caplog.records if "needs a restart" in r.getMessage()]
            assert ing.app.redis.connection is not None and ing.app.redis.connection.url == fresh_redis_server.url
            assert await _x_cache(oc) == "MISS"
            await wait_entries(ing.url, 1)
            assert await _x_cache(oc) == "HIT"

            # Fields hot-reload: stream buffering off makes streams BYPASS; disabled: no header.
            redis = {"url": fresh_redis_server.url}
            _write(path, cache_config(backends, backend="redis", redis=redis, stream_buffering=False))
            assert ing.app.reload()
            assert await _x_cache(oc, stream=True) == "BYPASS"
            _write(path, {**cache_config(backends, backend="redis", redis=redis), "response_cache": {"enabled": False}})
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                assert ing.app.reload()
            # `enabled: false` came with the default backend (memory): a restart is needed for that.
            assert any("needs a restart" in r.getMessage() for r in caplog.records)
            assert await _x_cache(oc) is None
            assert (await cache_stats(ing.url))["enabled"] is False
            assert len(stubs[0].stub.requests) == 4
