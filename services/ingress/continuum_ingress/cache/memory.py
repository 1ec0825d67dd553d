"""`InMemoryCacheStore`: LRU by entry count plus a per-entry TTL, every operation O(1).

An `OrderedDict` keeps recency order (`move_to_end` on a hit, `popitem(last=False)` evicts the
least recently used). Expiry is checked lazily on read, so no timer or task is needed; an
expired entry still occupies a slot until it is read, evicted or swept by `stats()`.
Sizes count key and value bytes (the payload), not Python object overhead.

The synchronous `*_now` methods are the real implementation; the async methods satisfy the
`CacheStore` protocol. The facade uses the synchronous ones for the memory store to save a
coroutine per call on the hot path.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from continuum_ingress.cache.store import CacheStoreStats


class InMemoryCacheStore:
    backend = "memory"

    def __init__(self, capacity: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._clock = clock
        self._data: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._size = 0
        self._evictions = 0
        self._expirations = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._data)

    def resize(self, capacity: int) -> None:
        """Hot reload of `capacity`: shrinking evicts the least recently used entries."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        while len(self._data) > capacity:
            self._evict_oldest()

    def get_now(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        value, expires_at = item
        if expires_at <= self._clock():
            self._remove(key, value)
            self._expirations += 1
            return None
        self._data.move_to_end(key)
        return value

    def set_now(self, key: str, value: bytes, ttl: float) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        old = self._data.pop(key, None)
        if old is not None:
            self._size -= len(key) + len(old[0])
        elif len(self._data) >= self._capacity:
            self._evict_oldest()
        self._data[key] = (value, self._clock() + ttl)
        self._size += len(key) + len(value)

    def delete_now(self, key: str) -> bool:
        item = self._data.get(key)
        if item is None:
            return False
        self._remove(key, item[0])
        return True

    def clear_now(self) -> int:
        removed = len(self._data)
        self._data.clear()
        self._size = 0
        return removed

    def sweep(self) -> int:
        """Drop every expired entry (O(n); used by `stats()`, never on the request path)."""
        now = self._clock()
        dead = [k for k, (_, expires_at) in self._data.items() if expires_at <= now]
        for key in dead:
            self._remove(key, self._data[key][0])
        self._expirations += len(dead)
        return len(dead)

    def stats_now(self) -> CacheStoreStats:
        self.sweep()
        return CacheStoreStats(
            backend=self.backend,
            entries=len(self._data),
            capacity=self._capacity,
            size_bytes=self._size,
            evictions=self._evictions,
            expirations=self._expirations,
        )

    def _evict_oldest(self) -> None:
        key, (value, _) = self._data.popitem(last=False)
        self._size -= len(key) + len(value)
        self._evictions += 1

    def _remove(self, key: str, value: bytes) -> None:
        del self._data[key]
        self._size -= len(key) + len(value)

    # CacheStore protocol
    async def get(self, key: str) -> bytes | None:
        return self.get_now(key)

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        self.set_now(key, value, ttl)

    async def delete(self, key: str) -> None:
        self.delete_now(key)

    async def clear(self) -> int:
        return self.clear_now()

    async def stats(self) -> CacheStoreStats:
        return self.stats_now()
