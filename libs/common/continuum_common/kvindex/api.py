"""The two faces of a KV index.

`KvIndex` is what the ingress scorer reads: one call per routing decision, pipelined over every
prefix it needs. `KvIndexWriter` is what the indexer (or, in embedded mode, the ingress itself)
feeds events into. `InMemoryKvIndex` and `RedisKvIndex` implement both and pass the same
behavioural tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from continuum_common.events import KvEvent
from continuum_common.kvindex.types import ApplyReport, BackendCounters, ClearReport, IndexStats, KvHolder


@runtime_checkable
class KvIndex(Protocol):
    """Read side. Prefix hashes are 64 lowercase hex characters (`prefix_key.hex()`)."""

    async def query_many(self, prefix_hashes: Iterable[str]) -> dict[str, list[KvHolder]]:
        """Holders of each distinct prefix, best first (most tokens, then backend name).
        Every requested prefix is a key of the result; unknown or expired ones map to []."""
        ...

    async def query_backends(self, prefix_hash: str) -> list[KvHolder]:
        """Holders of one prefix, best first; [] when nobody holds it."""
        ...


@runtime_checkable
class KvIndexWriter(Protocol):
    """Write side and administration."""

    async def apply_batch(self, events: Sequence[KvEvent]) -> ApplyReport:
        """Apply events in any order, any number of times: the index ends as if each had been
        applied once, in `(source_epoch, seq)` order per backend. Raises KvIndexError when the
        store failed; nothing is then known to be applied and the whole batch may be retried."""
        ...

    def count_events(self, backend: str, *, received: int = 0, dropped: int = 0) -> None:
        """Add to a backend's consumer counters (kept with the index so every replica's admin
        view shows fleet-wide numbers); never blocks, may be flushed later."""
        ...

    async def cleanup_expired(self) -> int:
        """Drop expired bookkeeping now (the index also expires lazily); return how many."""
        ...

    async def stats(self) -> IndexStats: ...

    async def backend_counters(self) -> Mapping[str, BackendCounters]: ...

    async def clear(self) -> ClearReport:
        """Forget everything (admin, debugging); the index refills from new events."""
        ...

    async def close(self) -> None: ...
