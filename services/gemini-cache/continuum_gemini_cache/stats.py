"""Counters shared by every replica (flushed to the store in batches, so the request path never
waits on them) and the seed's stats JSON."""

from __future__ import annotations

from collections import Counter
from typing import Any

from continuum_gemini_cache.config import Settings
from continuum_gemini_cache.errors import StateError
from continuum_gemini_cache.metrics import Metrics
from continuum_gemini_cache.model import Counts
from continuum_gemini_cache.store import Store

# The seed's counters (GET /admin/gemini-context-cache/stats). hit/miss/negative/ineligible and
# cached_tokens are request outcomes reported by the ingress (continuum.gemini.usage); creates,
# create_failures and evictions are counted here.
SEED_COUNTERS = ("hit", "miss", "ineligible", "negative", "creates", "create_failures", "evictions", "cached_tokens")
LOOKUP_RESULTS = ("hit", "miss", "negative")
EXTRA_COUNTERS = (
    "extends",
    "extend_failures",
    "deletes",
    "delete_failures",
    "stale",
    "expired",
    "replaced",
    "cleared",
    "invalid_ensures",
)


class StatsTally:
    def __init__(self, store: Store, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics
        self._deltas: Counter[str] = Counter()

    def count(self, backend: str, name: str, n: int = 1) -> None:
        self._deltas[f"{backend}|{name}"] += n

    def lookup(self, backend: str, result: str) -> None:
        self._metrics.lookups.labels(backend, result).inc()
        self.count(backend, "lookup_" + result)

    def removed(self, backend: str, reason: str) -> None:
        self._metrics.removals.labels(backend, reason).inc()
        self.count(backend, reason)

    async def flush(self) -> None:
        deltas, self._deltas = self._deltas, Counter()
        if not deltas:
            return
        try:
            await self._store.add_counters(deltas)
        except StateError:
            # Keep them for the next flush; the key set is bounded (backends x counter names).
            self._metrics.store_errors.labels("counters").inc()
            self._deltas.update(deltas)


def _per_backend(counters: dict[str, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for field, value in counters.items():
        backend, _, name = field.partition("|")
        out.setdefault(backend, {})[name] = value
    return out


def _block(values: dict[str, int]) -> dict[str, Any]:
    block: dict[str, Any] = {name: values.get(name, 0) for name in SEED_COUNTERS}
    block["lookups"] = {r: values.get("lookup_" + r, 0) for r in LOOKUP_RESULTS}
    block.update({name: values.get(name, 0) for name in EXTRA_COUNTERS})
    return block


def build_stats(settings: Settings, state_backend: str, counts: Counts, counters: dict[str, int]) -> dict[str, Any]:
    per = _per_backend(counters)
    totals: Counter[str] = Counter()
    for values in per.values():
        totals.update(values)
    backends: dict[str, Any] = {}
    for name in sorted(set(settings.backends) | set(counts.per_backend) | (set(per) - {"-"})):
        entries, negatives = counts.per_backend.get(name, (0, 0))
        backends[name] = {"entries": entries, "negative_entries": negatives, **_block(per.get(name, {}))}
    config = settings.cache.model_dump(mode="json")
    config["ttl_seconds"] = settings.cache.ttl
    return {
        "enabled": True,
        "config": config,
        "state_backend": state_backend,
        "entries": counts.entries,
        "negative_entries": counts.negative_entries,
        "in_flight": counts.in_flight,
        **_block(dict(totals)),
        "backends": backends,
    }
