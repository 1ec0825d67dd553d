"""The gemini-cache state store: one behaviour suite, run against the memory store and against
the Redis store on a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis.crc import key_slot

from continuum_common.procs import RedisServer
from continuum_gemini_cache.adapters.redis_store import RedisStore
from continuum_gemini_cache.memory_store import MemoryStore
from continuum_gemini_cache.model import Entry, Found, NegativeEntry, Removal
from continuum_gemini_cache.store import Store

NOW = 1_800_000_000.0


def digest(i: int) -> str:
    return f"{i:064x}"


def entry(i: int, *, backend: str = "gem-a", expire: float = NOW + 600, name: str | None = None) -> Entry:
    return Entry(backend, digest(i), "gemini-2.5-flash", name or f"cachedContents/c{i}", expire, 600.0, NOW, 5000)


def negative(i: int, *, until: float = NOW + 600, backend: str = "gem-a") -> NegativeEntry:
    return NegativeEntry(backend, digest(i), "gemini-2.5-flash", until, NOW, 1024, 16)


@pytest_asyncio.fixture(params=["memory", "redis"], loop_scope="session")
async def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    client = aioredis.Redis(host=redis_server.host, port=redis_server.port, socket_timeout=2)
    s = RedisStore(client, "cr:gem:")
    yield s
    await s.aclose()


async def test_miss_put_hit_and_touch(store: Store) -> None:
    state = await store.lookup("gem-a", digest(1), NOW, touch=True)
    assert state.found is Found.MISS and not state.in_flight
    assert await store.put_entry(entry(1), NOW, 100) == []
    hit = await store.lookup("gem-a", digest(1), NOW + 5, touch=True)
    assert hit.found is Found.HIT and hit.entry is not None
    assert hit.entry.name == "cachedContents/c1" and hit.entry.token_count == 5000
    assert hit.entry.last_use == pytest.approx(NOW + 5)
    # Entries are per backend: the same digest on another backend is a different resource.
    assert (await store.lookup("gem-b", digest(1), NOW, touch=True)).found is Found.MISS


async def test_expired_entry_is_removed_on_read(store: Store) -> None:
    await store.put_entry(entry(1, expire=NOW + 10), NOW, 100)
    state = await store.lookup("gem-a", digest(1), NOW + 10, touch=False)
    assert state.found is Found.MISS and state.expired is not None and state.expired.name == "cachedContents/c1"
    assert (await store.counts()).entries == 0


async def test_negative_entries_live_until_their_deadline(store: Store) -> None:
    await store.put_negative(negative(2, until=NOW + 60), NOW, 100)
    state = await store.lookup("gem-a", digest(2), NOW + 59, touch=True)
    assert state.found is Found.NEGATIVE and state.negative is not None
    assert state.negative.min_total_token_count == 1024
    assert (await store.lookup("gem-a", digest(2), NOW + 60, touch=True)).found is Found.MISS
    assert (await store.counts()).negative_entries == 0


async def test_lru_evicts_least_recently_used_and_reports_it(store: Store) -> None:
    for i in range(3):
        await store.put_entry(entry(i), NOW + i, 3)
    await store.lookup("gem-a", digest(0), NOW + 10, touch=True)  # 0 is now the most recent
    removed = await store.put_entry(entry(3), NOW + 11, 3)
    assert [(r.reason, r.entry.name if r.entry else None) for r in removed] == [(Removal.EVICTED, "cachedContents/c1")]
    assert (await store.lookup("gem-a", digest(1), NOW + 12, touch=False)).found is Found.MISS
    assert (await store.counts()).entries == 3


async def test_negatives_share_the_bound_and_expired_records_go_first(store: Store) -> None:
    await store.put_entry(entry(0), NOW, 3)
    await store.put_negative(negative(1, until=NOW + 5), NOW + 1, 3)  # expires early
    await store.put_entry(entry(2), NOW + 2, 3)
    # Full (3 of 3). The expired negative goes before the least recently used live entry 0.
    removed = await store.put_entry(entry(3), NOW + 10, 3)
    assert [(r.reason, r.negative is not None) for r in removed] == [(Removal.EXPIRED, True)]
    assert (await store.lookup("gem-a", digest(0), NOW + 11, touch=False)).found is Found.HIT
    # No expired record left: a negative entry is evicted by LRU like an entry.
    await store.put_negative(negative(4), NOW + 12, 3)
    counts = await store.counts()
    assert counts.entries + counts.negative_entries == 3 and counts.negative_entries == 1


async def test_replacing_an_id_reports_the_old_resource(store: Store) -> None:
    await store.put_entry(entry(1, name="cachedContents/old"), NOW, 10)
    removed = await store.put_entry(entry(1, name="cachedContents/new"), NOW + 1, 10)
    assert [(r.reason, r.entry.name if r.entry else None) for r in removed] == [
        (Removal.REPLACED, "cachedContents/old")
    ]
    assert (await store.counts()).entries == 1
    # A successful create after a negative entry replaces the negative silently.
    await store.put_negative(negative(2), NOW, 10)
    assert await store.put_entry(entry(2), NOW + 1, 10) == []
    assert (await store.lookup("gem-a", digest(2), NOW + 2, touch=False)).found is Found.HIT


async def test_drop_only_the_named_resource(store: Store) -> None:
    await store.put_entry(entry(1, name="cachedContents/fresh"), NOW, 10)
    assert await store.drop("gem-a", digest(1), "cachedContents/stale") is None
    assert (await store.lookup("gem-a", digest(1), NOW, touch=False)).found is Found.HIT
    dropped = await store.drop("gem-a", digest(1), "cachedContents/fresh")
    assert dropped is not None and dropped.name == "cachedContents/fresh"
    assert (await store.lookup("gem-a", digest(1), NOW, touch=False)).found is Found.MISS


async def test_update_expiry_after_a_patch(store: Store) -> None:
    await store.put_entry(entry(1, expire=NOW + 100), NOW, 10)
    assert not await store.update_expiry(entry(1, name="cachedContents/other"), NOW + 900, 600)
    assert await store.update_expiry(entry(1), NOW + 900.123456, 700)
    hit = await store.lookup("gem-a", digest(1), NOW + 500, touch=False)
    assert hit.found is Found.HIT and hit.entry is not None
    assert hit.entry.expire_at == NOW + 900.123456 and hit.entry.ttl_seconds == 700  # exact, no float loss
    # The new expiry also governs pruning: nothing is expired at NOW + 800.
    assert await store.prune_expired(NOW + 800, 100) == []


async def test_create_lock_is_single_flight_and_expires(store: Store) -> None:
    assert await store.acquire_create_lock("gem-a", digest(1), "t1", 200)
    assert not await store.acquire_create_lock("gem-a", digest(1), "t2", 200)
    assert (await store.lookup("gem-a", digest(1), NOW, touch=False)).in_flight
    assert (await store.counts()).in_flight == 1
    await store.release_create_lock("gem-a", digest(1), "t2")  # not the holder: no effect
    assert not await store.acquire_create_lock("gem-a", digest(1), "t3", 200)
    await store.release_create_lock("gem-a", digest(1), "t1")
    assert (await store.counts()).in_flight == 0
    assert await store.acquire_create_lock("gem-a", digest(1), "t4", 100)
    await asyncio.sleep(0.25)  # a crashed holder's lock expires
    assert (await store.counts()).in_flight == 0
    assert await store.acquire_create_lock("gem-a", digest(1), "t5", 100)
    assert await store.acquire_extend_lock("gem-a", digest(1), "x", 1000)
    assert not await store.acquire_extend_lock("gem-a", digest(1), "y", 1000)


async def test_clear_counts_and_counters(store: Store) -> None:
    await store.put_entry(entry(1), NOW, 10)
    await store.put_entry(entry(2, backend="gem-b"), NOW, 10)
    await store.put_negative(negative(3), NOW, 10)
    counts = await store.counts()
    assert (counts.entries, counts.negative_entries) == (2, 1)
    assert counts.per_backend == {"gem-a": (1, 1), "gem-b": (1, 0)}
    entries, negatives = await store.clear()
    assert sorted(e.name for e in entries) == ["cachedContents/c1", "cachedContents/c2"] and negatives == 1
    counts = await store.counts()
    assert (counts.entries, counts.negative_entries, counts.per_backend) == (0, 0, {})
    await store.add_counters({"gem-a|creates": 2, "gem-a|hit": 5})
    await store.add_counters({"gem-a|creates": 1})
    assert await store.read_counters() == {"gem-a|creates": 3, "gem-a|hit": 5}


async def test_redis_keys_share_one_cluster_slot(redis_server: RedisServer) -> None:
    client = aioredis.Redis(host=redis_server.host, port=redis_server.port)
    store = RedisStore(client, "cr:gem:")
    try:
        await store.put_entry(entry(1), NOW, 10)
        await store.put_negative(negative(2), NOW, 10)
        await store.acquire_create_lock("gem-a", digest(3), "t", 5000)
        await store.add_counters({"gem-a|creates": 1})
        keys = sorted(k.decode() for k in await client.keys("*"))
        assert keys and all(k.startswith("cr:gem:{gem}:") for k in keys), keys
        # Redis Cluster hashes only the {tag}: every key lands in the same slot.
        assert len({key_slot(k.encode()) for k in keys}) == 1
        assert key_slot(b"cr:gem:{gem}:e") != key_slot(b"cr:gem:e")
    finally:
        await store.aclose()
