"""A Redis restart under load costs exactly one fallback episode.

Before the shared client had pool health checks and a retry on connection errors, every
connection pooled before the restart failed on its first command after Redis came back
("Connection closed by server"), and the response cache fell back to memory again for a full
monitor interval. Real redis-server on a free port, killed and restarted on the same port;
the ingress in front of its test upstream; the KV index on the same client builder."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from continuum_common.config.router import Redis
from continuum_common.events import EventType, KvEvent
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import RedisServer
from continuum_common.redis_client import RedisClient, make_redis
from continuum_testing.cache_support import ADMIN_ENV, ADMIN_TOKEN, cache_config, metric
from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

POOL = 8


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


async def _fill_pool(client: RedisClient) -> None:
    """Open every pool connection: POOL commands that each hold one for 100 ms at once."""
    await asyncio.gather(*(client.blpop(["pool-health:nothing"], timeout=0.1) for _ in range(POOL)))


async def _restart(server: RedisServer) -> None:
    await server.kill()
    await server.start()  # same port, empty


async def test_commands_on_connections_pooled_before_a_restart_succeed(fresh_redis_server: RedisServer) -> None:
    client = make_redis(Redis(url=fresh_redis_server.url, pool_size=POOL))
    try:
        await _fill_pool(client)
        await _restart(fresh_redis_server)
        # Every one of these lands on a connection the old server closed.
        results = await asyncio.gather(*(client.set(f"k{i}", b"v") for i in range(POOL)), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert await client.dbsize() == POOL
    finally:
        await client.aclose()


async def test_kv_index_reads_and_writes_survive_a_restart(fresh_redis_server: RedisServer) -> None:
    """The KV index reader (ingress) and writer (indexer) share the client builder."""
    client = make_redis(Redis(url=fresh_redis_server.url, pool_size=POOL))
    index = RedisKvIndex(client)
    prefix = "ab" * 32
    try:
        await index.apply_batch([KvEvent("b1", 1, 1, time.time(), EventType.CREATED, prefix, 64)])
        await _fill_pool(client)
        await _restart(fresh_redis_server)
        reads = await asyncio.gather(*(index.query_many([prefix]) for _ in range(POOL)), return_exceptions=True)
        assert [r for r in reads if isinstance(r, BaseException)] == []
        assert all(r == {prefix: []} for r in reads)  # the restarted Redis is empty
        await _fill_pool(client)
        await _restart(fresh_redis_server)
        # The writer's scripts are gone with the restart: reloaded on a pooled connection.
        await index.apply_batch([KvEvent("b1", 2, 1, time.time(), EventType.CREATED, prefix, 64)])
        assert [h.backend for h in await index.query_backends(prefix)] == ["b1"]
    finally:
        await client.aclose()


async def _load(url: str, stop: asyncio.Event, statuses: list[int], worker: int) -> None:
    """One client sending chat requests back to back (a few distinct prompts, so some hit)."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        n = 0
        while not stop.is_set():
            body = {"model": "m", "messages": [{"role": "user", "content": f"w{worker} q{n % 5}"}], "temperature": 0}
            response = await client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-t"})
            statuses.append(response.status_code)
            n += 1


async def test_redis_restart_under_load_is_one_fallback_episode(fresh_redis_server: RedisServer) -> None:
    redis_cfg: dict[str, Any] = {
        "url": fresh_redis_server.url,
        "pool_size": POOL,
        "connect_timeout_ms": 300,
        "command_timeout_ms": 300,
    }
    async with running_stubs("a") as stubs:
        cfg = cache_config(stub_backends(stubs), backend="redis", redis=redis_cfg)
        async with running_ingress(cfg, cache_monitor_interval_s=0.2) as ing:
            stop = asyncio.Event()
            statuses: list[int] = []
            workers = [asyncio.create_task(_load(ing.url, stop, statuses, i)) for i in range(2 * POOL)]
            try:
                await asyncio.sleep(1.0)  # every pool connection in use
                assert await metric(ing.url, "continuum_cache_fallback_episodes_total") == 0
                await fresh_redis_server.kill()
                async with asyncio.timeout(5):
                    while await metric(ing.url, "continuum_cache_fallback_active") != 1:
                        await asyncio.sleep(0.02)
                await asyncio.sleep(0.5)
                served_during_outage = len(statuses)
                await fresh_redis_server.start()
                async with asyncio.timeout(5):
                    while await metric(ing.url, "continuum_cache_fallback_active") != 0:
                        await asyncio.sleep(0.02)
                # Long enough for the load to use every connection pooled before the restart.
                await asyncio.sleep(1.5)
            finally:
                stop.set()
                await asyncio.gather(*workers)
            assert await metric(ing.url, "continuum_cache_fallback_episodes_total") == 1
            assert await metric(ing.url, "continuum_cache_fallback_active") == 0
            assert set(statuses) == {200}
            assert len(statuses) > served_during_outage > 0
