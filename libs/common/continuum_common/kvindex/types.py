"""Values the KV index hands out and takes in: holders, reports, statistics, errors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from continuum_common.errors import ContinuumError
from continuum_common.events import Tier


class KvIndexError(ContinuumError):
    """The KV index could not be read or written (the caller decides: fall back, nak, retry)."""


class KvHolder(NamedTuple):
    """One backend holding a prefix: `(backend, token_count, tier)`.

    `tier` is where the backend's deepest copy of the prefix lives: `gpu_hot` when it is
    GPU-resident (reported even if a warm copy also exists), else `storage_warm`."""

    backend: str
    token_count: int
    tier: Tier


@dataclass(slots=True)
class ApplyReport:
    """What one `apply_batch` call did. `created`/`evicted` count holder transitions per backend
    (a backend starting or stopping to hold a prefix); they feed the admin `backends` view."""

    applied: int = 0  # events that changed at least one field of an entry
    stale: int = 0  # events older than what the entry (or the backend's last clear) records
    ignored: int = 0  # events the tier policy has no use for (warm tiers with tracking off)
    clears: int = 0
    created: Counter[str] = field(default_factory=Counter)
    evicted: Counter[str] = field(default_factory=Counter)

    def merge(self, other: ApplyReport) -> None:
        self.applied += other.applied
        self.stale += other.stale
        self.ignored += other.ignored
        self.clears += other.clears
        self.created.update(other.created)
        self.evicted.update(other.evicted)


@dataclass(frozen=True, slots=True)
class IndexStats:
    """The seed's `index` block of `GET /admin/kv-index/stats`.

    `prefix_count`: prefixes written within the entry TTL; `entry_count`: (prefix, backend)
    holder pairs. The Redis backend computes both from its LRU and reverse-index sorted sets,
    so they may include entries that stopped holding within the last TTL (docs/kv-index.md)."""

    prefix_count: int
    entry_count: int
    total_evictions: int
    backend: str


@dataclass(frozen=True, slots=True)
class BackendCounters:
    """Per-backend event counters for the admin `backends` view (fleet-wide in Redis)."""

    received: int = 0  # events the consumers took off the bus / SSE for this backend
    dropped: int = 0  # events dropped before the index (undecodable, wrong subject, ...)
    applied: int = 0
    stale: int = 0
    index_created: int = 0
    index_evicted: int = 0
    clears: int = 0

    @classmethod
    def from_counts(cls, counts: Mapping[str, int]) -> BackendCounters:
        return cls(**{name: int(counts.get(name, 0)) for name in COUNTER_NAMES})


COUNTER_NAMES = ("received", "dropped", "applied", "stale", "index_created", "index_evicted", "clears")


@dataclass(frozen=True, slots=True)
class ClearReport:
    entries_before_clear: int
    cleared_entries: int
