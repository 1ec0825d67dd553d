"""The indexer's Prometheus metrics, on a registry of its own (never the global one).

Label values come from allow-lists: `backend` is a backend named in the configuration, or
`other` (bus subjects are not trusted to bound cardinality); `reason`, `result`, `change`,
`transport` and `operation` take only the values listed here.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from continuum_common.loop_lag import LAG_BUCKETS

# A dropped bus message is one v1 event or one whole v2 batch.
DROP_REASONS = ("decode", "too_large", "backend_mismatch", "not_bus_source", "invalid", "unknown_type", "write_failed")
BLOCK_RESULTS = ("applied", "stale")
TIERS = ("gpu", "storage")
RESULTS = ("applied", "stale", "ignored")
TRANSPORTS = ("event_bus", "sse")
OPERATIONS = ("apply", "maintenance", "admin")
EVENT_BUS_SOURCE = "event_bus"  # the `backend` label of the JetStream consumer's gauges
OTHER = "other"


class IndexerMetrics:
    """`loop_lag`: the standalone service's event-loop lag histogram (an index embedded in the
    ingress shares the ingress's registry, and the ingress reports its own loop)."""

    def __init__(
        self, known_backends: Iterable[str] = (), registry: CollectorRegistry | None = None, *, loop_lag: bool = False
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._known = frozenset(known_backends) | {EVENT_BUS_SOURCE}
        r = self.registry
        self.loop_lag = (
            Histogram(
                "continuum_indexer_event_loop_lag_seconds",
                "How much later than due the event loop ran a periodic timer",
                buckets=LAG_BUCKETS,
                registry=r,
            )
            if loop_lag
            else None
        )
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
        self._block_metrics(r)
        self.prefixes = Gauge("continuum_kv_index_prefixes", "Prefixes in the index", registry=r)
        self.entries = Gauge("continuum_kv_index_entries", "(prefix, backend) holder entries", registry=r)
        self.evictions = Gauge("continuum_kv_index_evictions", "Prefixes evicted by max_entries so far", registry=r)

    def backend(self, name: str | None) -> str:
        return name if name in self._known else OTHER

    def drop(self, backend: str | None, reason: str, count: int = 1) -> None:
        self.dropped.labels(self.backend(backend), reason if reason in DROP_REASONS else "invalid").inc(count)

    def _block_metrics(self, r: CollectorRegistry) -> None:
        """The block index's (version-2 batches)."""
        self.block_batches = Counter(
            "continuum_kv_block_batches_received", "Version-2 KV batches taken off the bus", ["backend"], registry=r
        )
        self.blocks_received = Counter(
            "continuum_kv_block_events_received",
            "Block events (hashes stored or removed) in the batches taken off the bus",
            ["backend"],
            registry=r,
        )
        self.blocks_applied = Counter(
            "continuum_kv_block_events_applied",
            "Block events by what applying them did (stale: older than the register, the backend's clear or its epoch)",
            ["result"],
            registry=r,
        )
        self.block_batches_stale = Counter(
            "continuum_kv_block_batches_stale", "Batches of an older epoch than the backend's newest", registry=r
        )
        self.block_clears = Counter("continuum_kv_block_clears", "AllCleared applied (watermark raised)", registry=r)
        self.block_resyncs = Counter(
            "continuum_kv_block_resync_requests",
            "Backends whose history the block index lacked: resync requests to their listener by outcome",
            ["backend", "outcome"],
            registry=r,
        )
        self.block_evictions = Counter(
            "continuum_kv_block_evictions", "Present blocks dropped by the max_entries bound", registry=r
        )
        self.block_apply_seconds = Histogram(
            "continuum_kv_block_apply_seconds",
            "Time to apply one pull batch's KV batches to the block index",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.block_lag_seconds = Histogram(
            "continuum_kv_block_lag_seconds",
            "From a batch's timestamp to its write to the block index (listener clock vs indexer clock)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0),
            registry=r,
        )
        self.block_index_blocks = Gauge(
            "continuum_kv_block_index_blocks", "Present blocks in the block index, by tier", ["tier"], registry=r
        )
        self.block_index_backends = Gauge(
            "continuum_kv_block_index_backends", "Backends with live state in the block index", registry=r
        )
        self.consumer_pending = Gauge(
            "continuum_kv_consumer_pending",
            "Messages of CONTINUUM_KV the durable consumer has not applied yet (JetStream pending + "
            "unacknowledged), as of the last maintenance pass: the event lag in messages",
            registry=r,
        )
