"""The KV scorer's own metrics, registered on the ingress app's registry.

The routing decision counter and the overlap histogram (`continuum_kv_index_routing_decisions
_total`, `continuum_kv_index_overlap_score`) belong to the selection pipeline (metrics.py); in
embedded memory mode the indexer's consumer metrics (`continuum_kv_event_dropped_total`,
`continuum_kv_consumer_connected`, ...) are registered by continuum_indexer.embedded on the same
registry. This module adds only what the scorer itself measures; no name is registered twice.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

QUERY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class KvScorerMetrics:
    def __init__(self, registry: CollectorRegistry, speculative_entries: Callable[[], float]) -> None:
        r = registry
        self.query_seconds = Histogram(
            "continuum_kv_index_query_duration_seconds",
            "One pipelined index read (query_many) by the scorer, per batch of prefixes",
            buckets=QUERY_BUCKETS,
            registry=r,
        )
        lookups = Counter(
            "continuum_kv_index_lookups",
            "Prefixes looked up in the index by the scorer (hit: at least one holder)",
            ["result"],
            registry=r,
        )
        self.hits = lookups.labels("hit")
        self.misses = lookups.labels("miss")
        self.query_errors = Counter(
            "continuum_kv_index_query_errors", "Scorer index reads that failed or timed out", registry=r
        )
        self.speculative_routes = Counter(
            "continuum_kv_index_speculative_routes",
            "kv_aware decisions whose winner held the prefix only provisionally (speculative entry)",
            registry=r,
        )
        gauge = Gauge(
            "continuum_kv_index_speculative_entries", "Live provisional (prefix, backend) entries", registry=r
        )
        gauge.set_function(speculative_entries)
