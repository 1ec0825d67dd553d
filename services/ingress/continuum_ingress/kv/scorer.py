"""KvOverlapScorer: the Tier 4 `BackendScorer` (seed §"Overlap 스코어링", §"비동기 준비 모델").

Two steps, because the index read is I/O and the pool's scoring loop is synchronous:

* `prepare(prefix_key, candidates)` makes sure the prefix's holders are cached (one index read
  per unique prefix per `cache_ttl_s`, 100 ms), refreshes the load snapshot (in-flight counts and
  success rates, also kept for 100 ms, so every candidate of a pass is compared at one instant),
  and computes the composite score of every holder (policy/kv_scoring.py);
* `score()` / `score_with_tier()` read that result: a dict lookup, no I/O.

Reads are coalesced: every prefix asked for in the same event-loop turn goes into one
`KvIndex.query_many()` call (one pipelined Redis round trip), and concurrent prepares of one
prefix share a single read. The embedded InMemoryKvIndex is read synchronously instead. A failed read raises into the pipeline, which counts it and falls
back to the configured strategy; after a failure the index is not asked again for
`error_backoff_s`, so an outage costs each request an immediate fallback, not a timeout.

Speculative entries (kv/speculative.py) are recorded by `note_decision()`, which the pipeline
calls after a KV-aware or PrefixAwareHash decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from continuum_common.kvindex import InMemoryKvIndex, KvHolder, KvIndex, KvIndexError
from continuum_ingress.kv.speculative import SpeculativeEntries
from continuum_ingress.policy.kv_scoring import (
    Holding,
    LoadSample,
    Scores,
    Weights,
    composite_scores,
    merge_provisional,
)
from continuum_ingress.policy.scorer import HoldingTier
from continuum_ingress.policy.strategies import CandidateView

log = logging.getLogger("continuum.ingress.kv")

CACHE_TTL_S = 0.1  # seed: prepare() results and the load snapshot live 100 ms
MAX_CACHED_PREFIXES = 8192
QUERY_TIMEOUT_S = 1.0
ERROR_BACKOFF_S = 0.5
_NO_SCORE = (0.0, HoldingTier.NONE)


class KvIndexUnavailable(KvIndexError):
    """The index failed recently; the scorer is not asking it again yet."""


@dataclass(slots=True)
class _Slot:
    fetched_at: float
    holders: tuple[Holding, ...]
    scores: Scores = field(default_factory=dict)


@dataclass(slots=True)
class ScorerCounters:
    """Since process start; for GET /admin/kv-index/stats."""

    lookups: int = 0
    hits: int = 0
    queries: int = 0
    errors: int = 0
    speculative_routes: int = 0
    kv_aware_by_backend: Counter[str] = field(default_factory=Counter)


class KvOverlapScorer:
    def __init__(
        self,
        weights: Weights,
        *,
        speculative: SpeculativeEntries,
        index: KvIndex | None = None,
        cache_ttl_s: float = CACHE_TTL_S,
        max_cached: int = MAX_CACHED_PREFIXES,
        query_timeout_s: float = QUERY_TIMEOUT_S,
        error_backoff_s: float = ERROR_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
        observe_query: Callable[[float, int, int], None] | None = None,
        on_speculative_route: Callable[[], None] | None = None,
    ) -> None:
        self.weights = weights
        self.speculative = speculative
        self.index = index
        self.cache_ttl_s = cache_ttl_s
        self.max_cached = max_cached
        self.query_timeout_s = query_timeout_s
        self.error_backoff_s = error_backoff_s
        self.clock = clock
        self.counters = ScorerCounters()
        # (seconds, prefixes asked, prefixes held) per index read; -1 seconds = a failed read.
        self._observe = observe_query
        self._on_speculative_route = on_speculative_route
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._loads: dict[str, LoadSample] = {}
        self._loads_at = float("-inf")
        self._waiting: dict[str, asyncio.Future[BaseException | None]] = {}
        self._batch: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._down_until = float("-inf")

    # ---- BackendScorer ---------------------------------------------------------------------

    async def prepare(self, prefix_key: bytes, candidates: Sequence[CandidateView]) -> None:
        key = prefix_key.hex()
        now = self.clock()
        self._snapshot_loads(candidates, now)
        slot = self._slots.get(key)
        if slot is None or now - slot.fetched_at >= self.cache_ttl_s:
            await self._fetch(key, now)
            slot = self._slots.get(key)
            if slot is None:  # pushed out of a full cache by a burst of other prefixes
                return
        holders = merge_provisional(slot.holders, self.speculative.backends(key, self.clock()))
        slot.scores = composite_scores(holders, self._loads, self.weights)

    def holdings(self, prefix_key: bytes) -> list[Holding]:
        """The prefix's holders as prepare() last fetched them, plus live provisional rows."""
        key = prefix_key.hex()
        slot = self._slots.get(key)
        real = slot.holders if slot is not None else ()
        return merge_provisional(real, self.speculative.backends(key, self.clock()))

    def score(self, prefix_key: bytes, backend: str) -> float:
        return self.score_with_tier(prefix_key, backend)[0]

    def score_with_tier(self, prefix_key: bytes, backend: str) -> tuple[float, HoldingTier]:
        slot = self._slots.get(prefix_key.hex())
        if slot is None:
            return _NO_SCORE
        return slot.scores.get(backend, _NO_SCORE)

    # ---- decisions (DecisionObserver) ------------------------------------------------------

    def note_decision(self, prefix_key: bytes, backend: str, decision: str) -> None:
        """Record a provisional entry for where the prefix just went (kv_aware / prefix_hash)."""
        key = prefix_key.hex()
        if decision == "kv_aware":
            self.counters.kv_aware_by_backend[backend] += 1
            slot = self._slots.get(key)
            if slot is not None and not any(h.backend == backend for h in slot.holders):
                self.counters.speculative_routes += 1
                if self._on_speculative_route is not None:
                    self._on_speculative_route()
        self.speculative.record(key, backend, self.clock())

    # ---- cache and reads -------------------------------------------------------------------

    def clear(self) -> None:
        """Forget cached holders and provisional entries (admin clear)."""
        self._slots.clear()
        self.speculative.clear()

    def _snapshot_loads(self, candidates: Sequence[CandidateView], now: float) -> None:
        if now - self._loads_at >= self.cache_ttl_s:
            self._loads = {c.name: LoadSample(c.in_flight, c.success_rate) for c in candidates}
            self._loads_at = now
            return
        for c in candidates:  # another candidate set within the same 100 ms: add what is new
            if c.name not in self._loads:
                self._loads[c.name] = LoadSample(c.in_flight, c.success_rate)

    async def _fetch(self, key: str, now: float) -> None:
        if now < self._down_until:
            raise KvIndexUnavailable("the KV index failed recently; using the selection strategy")
        if isinstance(self.index, InMemoryKvIndex):
            # The embedded index is a dict read: no batching, no round trip, no task switch.
            started = time.perf_counter()
            held = self._store([key], {key: self.index.holders_nowait(key)})
            if self._observe is not None:
                self._observe(time.perf_counter() - started, 1, held)
            return
        waiter = self._waiting.get(key)
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting[key] = waiter
            if not self._batch:
                asyncio.get_running_loop().call_soon(self._flush)
            self._batch.append(key)
        # Shielded: a request that gives up (the pipeline's 100 ms bound) leaves the read
        # running for the others, and its result still fills the cache.
        error = await asyncio.shield(waiter)
        if error is not None:
            raise error

    def _flush(self) -> None:
        keys, self._batch = self._batch, []
        if keys:
            task = asyncio.get_running_loop().create_task(self._read(keys))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read(self, keys: list[str]) -> None:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            if self.index is None:
                raise KvIndexUnavailable("the KV index is not open yet")
            async with asyncio.timeout(self.query_timeout_s):
                found = await self.index.query_many(keys)
            held = self._store(keys, found)
            if self._observe is not None:
                self._observe(time.perf_counter() - started, len(keys), held)
        except Exception as exc:  # any failure of the read is an index outage for routing
            error = exc if isinstance(exc, KvIndexError) else KvIndexError(f"index read: {type(exc).__name__}")
            self._down_until = self.clock() + self.error_backoff_s
            self.counters.errors += 1
            log.warning("KV index read failed (%s); falling back for %.1fs", type(exc).__name__, self.error_backoff_s)
            if self._observe is not None:
                self._observe(-1.0, len(keys), 0)
        finally:
            for key in keys:
                waiter = self._waiting.pop(key, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(error)

    def _store(self, keys: list[str], found: dict[str, list[KvHolder]]) -> int:
        now = self.clock()
        held = 0
        self.counters.queries += 1
        for key in keys:
            rows = found.get(key, [])
            held += 1 if rows else 0
            self._slots[key] = _Slot(now, tuple(Holding(h.backend, h.token_count, h.tier) for h in rows))
            self._slots.move_to_end(key)
        self.counters.lookups += len(keys)
        self.counters.hits += held
        while len(self._slots) > self.max_cached:
            self._slots.popitem(last=False)
        return held

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
