"""The indexer's Prometheus metrics, on a registry of its own (never the global one).

Label values come from allow-lists: `backend` is a backend named in the configuration, or
`other` (bus subjects are not trusted to bound cardinality); `reason`, `result`, `change`,
`transport` and `operation` take only the values listed here.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

DROP_REASONS = ("decode", "backend_mismatch", "not_bus_source", "invalid", "unknown_type")
RESULTS = ("applied", "stale", "ignored")
TRANSPORTS = ("event_bus", "sse")
OPERATIONS = ("apply", "maintenance", "admin")
EVENT_BUS_SOURCE = "event_bus"  # the `backend` label of the JetStream consumer's gauges
OTHER = "other"


class IndexerMetrics:
    def __init__(self, known_backends: Iterable[str] = (), registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._known = frozenset(known_backends) | {EVENT_BUS_SOURCE}
        r = self.registry
        self.received = Counter(
            "continuum_kv_events_received", "KV events taken off a transport", ["backend", "transport"], registry=r
        )
        self.dropped = Counter(
            "continuum_kv_event_dropped",
            "KV events dropped before the index, by reason",
            ["backend", "reason"],
            registry=r,
        )
        self.applied = Counter(
            "continuum_kv_events_applied", "KV events by what applying them did", ["result"], registry=r
        )
        self.changes = Counter(
            "continuum_kv_index_changes",
            "Backends starting (created) or stopping (evicted) to hold a prefix",
            ["backend", "change"],
            registry=r,
        )
        self.connected = Gauge(
            "continuum_kv_consumer_connected",
            "1 while an event consumer is connected (backend=event_bus for JetStream)",
            ["backend"],
            registry=r,
        )
        self.reconnects = Counter(
            "continuum_kv_consumer_reconnects", "Event consumer reconnections", ["backend"], registry=r
        )
        self.apply_seconds = Histogram(
            "continuum_kv_index_apply_seconds",
            "Time to apply one batch to the index",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.lag_seconds = Histogram(
            "continuum_kv_event_lag_seconds",
            "From the event's timestamp to the index write (listener clock vs indexer clock)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0),
            registry=r,
        )
        self.batch_size = Histogram(
            "continuum_kv_index_batch_events",
            "Events per applied batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500),
            registry=r,
        )
        self.errors = Counter(
            "continuum_kv_index_errors", "Index store failures (Redis) by operation", ["operation"], registry=r
        )
        self.prefixes = Gauge("continuum_kv_index_prefixes", "Prefixes in the index", registry=r)
        self.entries = Gauge("continuum_kv_index_entries", "(prefix, backend) holder entries", registry=r)
        self.evictions = Gauge("continuum_kv_index_evictions", "Prefixes evicted by max_entries so far", registry=r)

    def backend(self, name: str | None) -> str:
        return name if name in self._known else OTHER

    def drop(self, backend: str | None, reason: str, count: int = 1) -> None:
        self.dropped.labels(self.backend(backend), reason if reason in DROP_REASONS else "invalid").inc(count)
