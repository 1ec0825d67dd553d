"""RedisBlockIndex beyond the shared behaviour: the key layout (one cluster slot per backend,
under key_prefix), the liveness TTL on every key, a lost script cache, Redis going away, and
a read-only instance on a client the caller owns."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from continuum_common.config.loader import parse
from continuum_common.config.router import RouterConfig
from continuum_common.errors import ConfigError
from continuum_common.kvindex import InMemoryBlockIndex, KvIndexError, MatchQuery, open_block_index
from continuum_common.kvindex.adapters.redis_blocks import RedisBlockIndex
from continuum_common.kvindex.block_keys import BlockKeys
from continuum_common.procs import RedisClusterServer, RedisServer
from continuum_common.wire.kv import AllCleared, BlocksRemoved, BlocksStored
from continuum_testing.kvindex_block_model import batch, universe

H = universe(32)


async def test_every_key_of_a_backend_is_in_one_slot_under_the_prefix(redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    index = RedisBlockIndex(client, key_prefix="t1:kv:", ttl_seconds=30, tombstone_seconds=0.05)
    try:
        await index.apply_batches(
            [batch("vllm-0", 1, AllCleared(), BlocksStored(H[:4]), BlocksStored(H[4:6], tier=1), BlocksRemoved(H[:1]))]
        )
        await asyncio.sleep(0.1)
        await index.apply_batches([batch("vllm-0", 2, BlocksRemoved(H[1:2]))])  # rotates t0 -> t1 first
        keys = sorted(k.decode() for k in await client.keys("*"))
        assert all(k.startswith("t1:kv:blk:") for k in keys)
        backend_keys = [k for k in keys if k != "t1:kv:blk:backends"]
        assert {k.rsplit(":", 1)[1] for k in backend_keys} == {"m", "g", "s", "go", "so", "t0", "t1"}
        assert len({key_slot(k.encode()) for k in backend_keys}) == 1
        assert key_slot(b"t1:kv:blk:{vllm-0}:m") == key_slot(b"vllm-0")
        for key in backend_keys:  # the liveness TTL is on every key
            assert 0 < await client.pttl(key) <= 30_000
        assert await client.smembers("t1:kv:blk:backends") == {b"vllm-0"}
    finally:
        await client.aclose()


def test_the_key_prefix_must_not_hold_hash_tags() -> None:
    with pytest.raises(ConfigError):
        BlockKeys("cr:{x}:")


@pytest.mark.parametrize("cluster", [False, True])
async def test_a_lost_script_cache_is_reloaded(
    redis_server: RedisServer, redis_cluster: RedisClusterServer, cluster: bool
) -> None:
    client: aioredis.Redis | RedisCluster = (
        RedisCluster.from_url(redis_cluster.url) if cluster else aioredis.Redis.from_url(redis_server.url)
    )
    index = RedisBlockIndex(client)
    try:
        await index.apply_batches(
            [batch("a", 1, AllCleared(), BlocksStored(H[:3])), batch("b", 1, BlocksStored(H[:1]))]
        )
        await client.script_flush()  # what a restart or failover does to the script cache
        report = await index.apply_batches([batch("a", 2, BlocksStored(H[3:5])), batch("b", 2, BlocksStored(H[1:2]))])
        assert (report.batches, report.applied) == (2, 3)
        await client.script_flush()
        (got,) = await index.match_many([MatchQuery(H[:6], ["a", "b"])])
        assert (got["a"].gpu_blocks, got["b"].gpu_blocks) == (5, 2)
        await client.script_flush()
        assert set((await index.block_stats()).backends) == {"a", "b"}
    finally:
        await client.aclose()


async def test_redis_down_raises_kv_index_error_and_nothing_is_lost(fresh_redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(fresh_redis_server.url, socket_timeout=1, socket_connect_timeout=1)
    index = RedisBlockIndex(client)
    memory = InMemoryBlockIndex()
    first = [batch("a", 1, AllCleared(), BlocksStored(H[:3]))]
    try:
        await index.apply_batches(first)
        await memory.apply_batches(first)
        await fresh_redis_server.stop()
        retry = [batch("a", 2, BlocksStored(H[3:6]))]
        with pytest.raises(KvIndexError):
            await index.apply_batches(retry)
        with pytest.raises(KvIndexError):
            await index.match_many([MatchQuery(H[:6], ["a"])])
        with pytest.raises(KvIndexError):
            await index.block_stats()
        await fresh_redis_server.start()  # same port, empty (no persistence): the retry lands whole
        await index.apply_batches(retry)
        (got,) = await index.match_many([MatchQuery(H[3:6], ["a"])])
        assert got["a"].gpu_blocks == 3
    finally:
        await client.aclose()


async def test_open_block_index_follows_the_config(redis_server: RedisServer) -> None:
    def config(backend: str) -> RouterConfig:
        data = {"kv_cache_index": {"enabled": True, "backend": backend, "max_entries": 500, "entry_ttl_seconds": 60}}
        if backend == "redis":
            data["redis"] = {"url": redis_server.url}
        return parse(RouterConfig, data)

    memory = open_block_index(config("memory"))
    assert isinstance(memory, InMemoryBlockIndex) and memory.max_blocks == 500 and memory.ttl == 60
    owned = open_block_index(config("redis"))
    assert isinstance(owned, RedisBlockIndex) and owned.owns_client and owned.ttl_ms == 60_000
    await owned.apply_batches([batch("a", 1, BlocksStored(H[:2]))])
    await owned.close()
    # a read-only instance on a client the caller owns: closing the index leaves it open
    shared = aioredis.Redis.from_url(redis_server.url)
    try:
        reader = RedisBlockIndex.from_config(config("redis").kv_cache_index, shared)
        (got,) = await reader.match_many([MatchQuery(H[:2], ["a"])])
        assert got["a"].gpu_blocks == 2
        await reader.close()
        assert await shared.ping()
        same = open_block_index(config("redis"), shared)
        assert isinstance(same, RedisBlockIndex) and not same.owns_client
    finally:
        await shared.aclose()
