"""pytest fixtures around the real servers of continuum_common.procs.

* `nats_server` / `redis_server`: one process per test session (cheap tests share it);
  `redis_server` is flushed before every test that uses it so tests never see each other's keys,
  and the NATS fixture deletes every stream and KV bucket before each test.
* `fresh_nats_server` / `fresh_redis_server`: a private process per test, for tests that kill,
  restart or reconfigure the server.
* `redis_cluster`: a 3-primary Redis Cluster (RedisClusterServer) for the session, flushed
  before each test that uses it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from continuum_common.procs import NatsServer, RedisClusterServer, RedisServer


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def _session_nats() -> AsyncIterator[NatsServer]:
    server = NatsServer()
    await server.start()
    yield server
    await server.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def _session_redis() -> AsyncIterator[RedisServer]:
    server = RedisServer()
    await server.start()
    yield server
    await server.close()


async def _purge_jetstream(url: str) -> None:
    import nats

    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            if info.config.name:
                await js.delete_stream(info.config.name)
    finally:
        await nc.close()


@pytest_asyncio.fixture(loop_scope="session")
async def nats_server(_session_nats: NatsServer) -> NatsServer:
    if not _session_nats.running:  # a previous test stopped it
        await _session_nats.start()
    await _purge_jetstream(_session_nats.url)
    return _session_nats


@pytest_asyncio.fixture(loop_scope="session")
async def redis_server(_session_redis: RedisServer) -> RedisServer:
    import redis.asyncio as aioredis

    if not _session_redis.running:
        await _session_redis.start()
    client = aioredis.Redis(host=_session_redis.host, port=_session_redis.port)
    try:
        await client.flushall()
    finally:
        await client.aclose()
    return _session_redis


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_nats_server() -> AsyncIterator[NatsServer]:
    server = NatsServer()
    await server.start()
    yield server
    await server.close()


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_redis_server() -> AsyncIterator[RedisServer]:
    server = RedisServer()
    await server.start()
    yield server
    await server.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def _session_redis_cluster() -> AsyncIterator[RedisClusterServer]:
    cluster = RedisClusterServer()
    await cluster.start()
    yield cluster
    await cluster.close()


@pytest_asyncio.fixture(loop_scope="session")
async def redis_cluster(_session_redis_cluster: RedisClusterServer) -> RedisClusterServer:
    """A 3-primary Redis Cluster shared by the session, flushed before each test."""
    await _session_redis_cluster.flushall()
    return _session_redis_cluster


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_servers: uses real nats-server / redis-server processes")
