"""The `CacheStore` protocol (the seed's `CacheStore` trait) and the statistics it reports.

Keys handed to a store are logical: the 64-hex response-cache key, or `sem:<id>` for a
semantic-cache body. A store may prefix them (Redis: `cr:resp:`); callers never do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class CacheStoreStats:
    backend: str  # "memory" | "redis"
    entries: int
    capacity: int | None  # None: bounded by the server's own memory policy, not a count
    size_bytes: int
    evictions: int
    expirations: int = 0


@runtime_checkable
class CacheStore(Protocol):
    async def get(self, key: str) -> bytes | None:
        """The value, or None when absent or expired."""
        ...

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        """Store `value` for `ttl` seconds (> 0), replacing any previous value."""
        ...

    async def delete(self, key: str) -> None: ...

    async def clear(self) -> int:
        """Remove every entry this store owns; returns how many were removed."""
        ...

    async def stats(self) -> CacheStoreStats: ...
