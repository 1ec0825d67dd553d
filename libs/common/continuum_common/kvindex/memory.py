"""InMemoryKvIndex: the seed's embedded index (one process, no Redis).

* reads are plain dict lookups with no await inside, so any number of concurrent coroutines
  read a consistent index (the asyncio analogue of the seed's lock-free DashMap);
* TTL per prefix, checked lazily on every query and swept by `cleanup_expired()`;
* `max_entries` prefixes; going over evicts the oldest 10 % by last write (dict order);
* the same entry semantics as RedisKvIndex (continuum_common.kvindex.entry), so both pass one
  behavioural test suite.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.events import KvEvent
from continuum_common.kvindex.batch import plan_batch
from continuum_common.kvindex.entry import EntryState, TierPolicy, apply_writes
from continuum_common.kvindex.types import (
    ApplyReport,
    BackendCounters,
    ClearReport,
    IndexStats,
    KvHolder,
)

# How long an entry's stamps outlive its holdings, so a redelivered old event stays stale
# after the holdings expired (the Redis meta hash lives this much longer than the sorted set).
DEFAULT_TOMBSTONE_GRACE_S = 300.0
_NO_HOLDERS: tuple[KvHolder, ...] = ()
_SWEEP_SLICE = 4096


class _Prefix:
    __slots__ = ("entries", "holders", "holders_expire", "meta_expire")

    def __init__(self) -> None:
        self.entries: dict[str, EntryState] = {}
        self.holders: tuple[KvHolder, ...] = _NO_HOLDERS
        self.holders_expire = 0.0
        self.meta_expire = 0.0

    def rebuild(self) -> None:
        held = []
        for backend, state in self.entries.items():
            holding = state.holding()
            if holding is not None:
                held.append(KvHolder(backend, holding[0], holding[1]))
        held.sort(key=lambda h: (-h.token_count, h.backend))
        self.holders = tuple(held)

    def expire_holdings(self) -> None:
        self.entries = {b: s.expired() for b, s in self.entries.items()}
        self.holders = _NO_HOLDERS


class InMemoryKvIndex:
    def __init__(
        self,
        *,
        max_entries: int = 100_000,
        entry_ttl_seconds: float = 600.0,
        policy: TierPolicy | None = None,
        tombstone_grace_s: float = DEFAULT_TOMBSTONE_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.ttl = float(entry_ttl_seconds)
        self.meta_ttl = self.ttl + tombstone_grace_s
        self.policy = policy or TierPolicy()
        self._clock = clock
        # insertion order == write order: the first keys are the least recently written
        self._prefixes: dict[str, _Prefix] = {}
        self._watermarks: dict[str, str] = {}
        self._counters: dict[str, Counter[str]] = {}
        self._evictions = 0

    @classmethod
    def from_config(
        cls,
        cfg: KvCacheIndex,
        *,
        tombstone_grace_s: float = DEFAULT_TOMBSTONE_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> InMemoryKvIndex:
        return cls(
            max_entries=cfg.max_entries,
            entry_ttl_seconds=cfg.entry_ttl_seconds,
            policy=TierPolicy.from_config(cfg),
            tombstone_grace_s=tombstone_grace_s,
            clock=clock,
        )

    # ---- read side -------------------------------------------------------------------------

    def holders_nowait(self, prefix_hash: str) -> list[KvHolder]:
        """Synchronous read (the memory index never waits); what `query_backends` returns."""
        entry = self._prefixes.get(prefix_hash)
        if entry is None or not entry.holders:
            return []
        if self._clock() >= entry.holders_expire:
            self._expire(prefix_hash, entry)
            return []
        return list(entry.holders)

    async def query_backends(self, prefix_hash: str) -> list[KvHolder]:
        return self.holders_nowait(prefix_hash)

    async def query_many(self, prefix_hashes: Iterable[str]) -> dict[str, list[KvHolder]]:
        return {p: self.holders_nowait(p) for p in prefix_hashes}

    # ---- write side ------------------------------------------------------------------------

    async def apply_batch(self, events: Sequence[KvEvent]) -> ApplyReport:
        plan = plan_batch(events, self.policy)
        report = ApplyReport(ignored=plan.ignored)
        for backend, stamp in plan.clears.items():
            self._clear_backend(backend, stamp, report)
        now = self._clock()
        for prefix_hash, writes in plan.entries.items():
            entry = self._live_entry(prefix_hash, now)
            dirty = refreshed = False
            for write in writes:
                counters = self._counters.setdefault(write.backend, Counter())
                before = entry.entries.get(write.backend, EntryState())
                watermark = self._watermarks.get(write.backend)
                state = before.under_watermark(watermark) if watermark else before
                state, wrote = apply_writes(state, write.stamp, write.writes)
                held_before, held_after = before.holding() is not None, state.holding() is not None
                if wrote or (state.gpu_tokens, state.warm_tokens) != (before.gpu_tokens, before.warm_tokens):
                    entry.entries[write.backend] = state
                    dirty = True
                refreshed = refreshed or wrote
                counters["applied" if wrote else "stale"] += 1
                report.applied += wrote
                report.stale += not wrote
                if held_after and not held_before:
                    report.created[write.backend] += 1
                    counters["index_created"] += 1
                elif held_before and not held_after:
                    report.evicted[write.backend] += 1
                    counters["index_evicted"] += 1
            if dirty:
                entry.rebuild()
            if refreshed:  # a write refreshes the TTL and the place in the LRU order
                entry.holders_expire = now + self.ttl
                entry.meta_expire = now + self.meta_ttl
                # move to the end: most recently written
                self._prefixes.pop(prefix_hash, None)
                self._prefixes[prefix_hash] = entry
        self._enforce_max_entries()
        return report

    def _live_entry(self, prefix_hash: str, now: float) -> _Prefix:
        entry = self._prefixes.get(prefix_hash)
        if entry is None or now >= entry.meta_expire:
            return _Prefix()
        if now >= entry.holders_expire:
            entry.expire_holdings()
        return entry

    def _clear_backend(self, backend: str, stamp: str, report: ApplyReport) -> None:
        if stamp <= self._watermarks.get(backend, ""):
            return
        self._watermarks[backend] = stamp
        counters = self._counters.setdefault(backend, Counter())
        counters["clears"] += 1
        report.clears += 1
        now = self._clock()
        for prefix_hash, entry in list(self._prefixes.items()):
            state = entry.entries.get(backend)
            if state is None:
                continue
            if now >= entry.holders_expire:
                self._expire(prefix_hash, entry)
                continue
            cleared = state.under_watermark(stamp)
            if cleared == state:
                continue
            entry.entries[backend] = cleared
            if state.holding() is not None and cleared.holding() is None:
                report.evicted[backend] += 1
                counters["index_evicted"] += 1
            entry.rebuild()

    def _enforce_max_entries(self) -> None:
        over = len(self._prefixes) - self.max_entries
        if over <= 0:
            return
        # the seed: reaching max_entries evicts the oldest 10 %
        count = over + max(1, self.max_entries // 10)
        for prefix_hash in list(itertools.islice(self._prefixes, count)):
            del self._prefixes[prefix_hash]
        self._evictions += count

    def _expire(self, prefix_hash: str, entry: _Prefix) -> None:
        if self._clock() >= entry.meta_expire:
            self._prefixes.pop(prefix_hash, None)
        else:
            entry.expire_holdings()

    # ---- administration --------------------------------------------------------------------

    async def cleanup_expired(self) -> int:
        """Sweep expired prefixes, yielding to the event loop every few thousand so a big
        index never stalls the ingress that embeds it."""
        now = self._clock()
        expired = 0
        for n, (prefix_hash, entry) in enumerate(list(self._prefixes.items()), start=1):
            if self._prefixes.get(prefix_hash) is not entry:
                continue  # rewritten while we yielded
            if now >= entry.meta_expire:
                del self._prefixes[prefix_hash]
                expired += 1
            elif entry.holders and now >= entry.holders_expire:
                entry.expire_holdings()
                expired += 1
            if n % _SWEEP_SLICE == 0:
                await asyncio.sleep(0)
        return expired

    def _live_counts(self) -> tuple[int, int]:
        now = self._clock()
        live = [e for e in self._prefixes.values() if e.holders and now < e.holders_expire]
        return len(live), sum(len(e.holders) for e in live)

    async def stats(self) -> IndexStats:
        prefixes, entries = self._live_counts()
        return IndexStats(prefixes, entries, self._evictions, backend="memory")

    def count_events(self, backend: str, *, received: int = 0, dropped: int = 0) -> None:
        counters = self._counters.setdefault(backend, Counter())
        counters["received"] += received
        counters["dropped"] += dropped

    async def backend_counters(self) -> Mapping[str, BackendCounters]:
        return {b: BackendCounters.from_counts(c) for b, c in sorted(self._counters.items())}

    async def clear(self) -> ClearReport:
        _, entries = self._live_counts()
        cleared = len(self._prefixes)
        self._prefixes.clear()
        self._watermarks.clear()
        return ClearReport(entries_before_clear=entries, cleared_entries=cleared)

    async def close(self) -> None:
        return None
