"""The state every replica shares (DESIGN.md §6, `cr:gem:*`): entries, negative entries, the
LRU order over both, single-flight create locks and extend locks, counters.

Two implementations with the same behaviour (one test suite runs against both):
`MemoryStore` (embedded mode, one process) and `adapters.redis_store.RedisStore` (production,
shared across replicas and restarts). Every method is atomic with respect to the others.

Times: `now` is the service clock in Unix seconds. Lock lifetimes are real milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from continuum_gemini_cache.model import Counts, Entry, LookupState, NegativeEntry, Removed


class Store(Protocol):
    kind: str  # "memory" | "redis"

    async def lookup(self, backend: str, digest: str, now: float, *, touch: bool) -> LookupState:
        """Hit / negative / miss for one id. Expired records of this id are removed (an expired
        entry is returned in `expired`). `touch` moves a hit to the LRU front."""
        ...

    async def put_entry(self, entry: Entry, now: float, max_entries: int) -> list[Removed]:
        """Store `entry` (replacing any record of its id), first pruning expired records and
        then evicting least-recently-used ones until entries + negatives fit `max_entries`."""
        ...

    async def put_negative(self, negative: NegativeEntry, now: float, max_entries: int) -> list[Removed]:
        """Same as put_entry for a negative entry (they share the bound and the LRU order)."""
        ...

    async def prune_expired(self, now: float, limit: int) -> list[Removed]:
        """Remove up to `limit` expired records (entries and negatives)."""
        ...

    async def update_expiry(self, entry: Entry, expire_at: float, ttl_seconds: float) -> bool:
        """After a successful PATCH: set the expiry, only while the stored entry still names
        `entry.name` (a replacement created meanwhile is left alone)."""
        ...

    async def drop(self, backend: str, digest: str, name: str) -> Entry | None:
        """Forget the entry when it still names `name` (a stale reference); return it."""
        ...

    async def clear(self) -> tuple[list[Entry], int]:
        """Remove every entry and negative entry; return the entries and the negative count."""
        ...

    async def acquire_create_lock(self, backend: str, digest: str, token: str, ttl_ms: int) -> bool: ...

    async def release_create_lock(self, backend: str, digest: str, token: str) -> None: ...

    async def acquire_extend_lock(self, backend: str, digest: str, token: str, ttl_ms: int) -> bool: ...

    async def counts(self) -> Counts: ...

    async def add_counters(self, deltas: Mapping[str, int]) -> None:
        """Add to the shared counters (field names `<backend>|<counter>`)."""
        ...

    async def read_counters(self) -> dict[str, int]: ...

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...
