"""InMemoryCacheStore: LRU by entry count, TTL, size accounting, hot resize."""

from __future__ import annotations

import pytest

from continuum_ingress.cache.memory import InMemoryCacheStore
from continuum_ingress.cache.store import CacheStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_is_a_cache_store() -> None:
    assert isinstance(InMemoryCacheStore(1), CacheStore)


async def test_lru_evicts_least_recently_used() -> None:
    store = InMemoryCacheStore(3)
    for k in "abc":
        await store.set(k, k.encode(), 60)
    assert await store.get("a") == b"a"  # a is now most recent; b is the LRU
    await store.set("d", b"d", 60)
    assert await store.get("b") is None
    assert [await store.get(k) for k in "acd"] == [b"a", b"c", b"d"]
    stats = await store.stats()
    assert stats.entries == 3 and stats.evictions == 1 and stats.capacity == 3


async def test_overwrite_does_not_evict_and_keeps_size_exact() -> None:
    store = InMemoryCacheStore(2)
    await store.set("a", b"12345", 60)
    await store.set("b", b"1", 60)
    await store.set("a", b"12", 60)
    stats = await store.stats()
    assert stats.entries == 2 and stats.evictions == 0
    assert stats.size_bytes == (1 + 2) + (1 + 1)
    await store.delete("a")
    assert (await store.stats()).size_bytes == 2


async def test_ttl_expires_entries() -> None:
    clock = Clock()
    store = InMemoryCacheStore(10, clock=clock)
    await store.set("short", b"x", 5)
    await store.set("long", b"y", 50)
    clock.now += 4.9
    assert await store.get("short") == b"x"
    clock.now += 0.2
    assert await store.get("short") is None
    assert await store.get("long") == b"y"
    clock.now += 100
    stats = await store.stats()  # the sweep drops the rest
    assert stats.entries == 0 and stats.size_bytes == 0 and stats.expirations == 2


async def test_clear_reports_count_and_resize_evicts_oldest() -> None:
    store = InMemoryCacheStore(5)
    for i in range(5):
        store.set_now(str(i), b"v", 60)
    store.get_now("0")
    store.resize(2)
    assert len(store) == 2 and store.get_now("0") == b"v" and store.get_now("4") == b"v"
    assert await store.clear() == 2
    assert len(store) == 0 and (await store.stats()).size_bytes == 0


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        InMemoryCacheStore(0)
    with pytest.raises(ValueError):
        InMemoryCacheStore(1).set_now("k", b"v", 0)
