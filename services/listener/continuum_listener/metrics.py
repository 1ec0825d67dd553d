"""The listener's Prometheus metrics, in a registry of its own (never the global one).

Label values come from allow-lists: `backend` from the configuration, `reason` / `what` /
`outcome` from the fixed sets below (anything else is reported as "other"), so a hostile engine
cannot inflate cardinality.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from continuum_common.loop_lag import LAG_BUCKETS
from continuum_listener.protocol.model import DROP_REASONS

CHAIN_EVENTS = frozenset(
    {
        "orphan",
        "salt_invalid",
        "salt_missing",
        "no_method",
        "no_tokens",
        "chain_too_long",
        "bad_tokens",
        "rebuild_failed",
        "placeholder_unknown",
        "remove_unknown",
        "pruned_blocks",
        "pruned_tokens",
    }
)
DETOKENIZE_OUTCOMES = frozenset({"determined", "pending", "failed", "unattributable", "queue_full", "cache_hit"})
EPOCH_REASONS = frozenset({"start", "publisher_restart", "gap", "replay_lost", "resync"})
BLOCK_KINDS = ("stored", "removed", "cleared")
REPLAY_OUTCOMES = frozenset({"recovered", "partial", "timeout", "failed", "restarted"})


def _pick(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else "other"


class ListenerMetrics:
    def __init__(self, backends: Iterable[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.backends = frozenset(backends)
        r = self.registry
        self.dropped = Counter(
            "continuum_kv_event_dropped_total",
            "Engine messages or normalized events dropped, by reason.",
            ["backend", "reason"],
            registry=r,
        )
        self.batches = Counter(
            "continuum_kv_listener_batches_total", "Engine batches received.", ["backend"], registry=r
        )
        self.block_events = Counter(
            "continuum_kv_listener_engine_events_total",
            "Engine events applied, by kind.",
            ["backend", "kind"],
            registry=r,
        )
        self.unknown_fields = Counter(
            "continuum_kv_listener_unknown_fields_total",
            "Event fields this listener does not know (ignored).",
            ["backend"],
            registry=r,
        )
        self.chain = Counter(
            "continuum_kv_listener_chain_events_total",
            "Chain-tracker decisions (unattributed chains, pruning, unknown hashes).",
            ["backend", "what"],
            registry=r,
        )
        self.mismatch = Counter(
            "continuum_kv_listener_block_size_mismatch_total",
            "Stored events whose token count did not match block_size.",
            ["backend"],
            registry=r,
        )
        self.published = Counter(
            "continuum_kv_listener_events_total",
            "Normalized events produced, by type.",
            ["backend", "type"],
            registry=r,
        )
        self.epochs = Counter(
            "continuum_kv_listener_epochs_total", "Source epochs started, by reason.", ["backend", "reason"], registry=r
        )
        self.replays = Counter(
            "continuum_kv_listener_replays_total",
            "ZMQ replay requests, by outcome.",
            ["backend", "outcome"],
            registry=r,
        )
        self.detokenize = Counter(
            "continuum_kv_listener_detokenize_total",
            "Detokenize attributions, by outcome.",
            ["backend", "outcome"],
            registry=r,
        )
        self.detokenize_seconds = Histogram(
            "continuum_kv_listener_detokenize_seconds",
            "Duration of one /detokenize call.",
            ["backend"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.connected = Gauge(
            "continuum_kv_listener_source_connected", "1 while the engine source is connected.", ["backend"], registry=r
        )
        self.reconnects = Counter(
            "continuum_kv_listener_reconnects_total", "Engine source (re)connections.", ["backend"], registry=r
        )
        self.resync_requests = Counter(
            "continuum_kv_listener_resync_requests_total",
            "Resync requests from KV index consumers that lost a backend's history, by outcome.",
            ["backend", "outcome"],
            registry=r,
        )
        self.denied = Counter(
            "continuum_kv_listener_publishers_denied_total",
            "ZMQ publishers refused by the allowed_publishers check.",
            ["backend"],
            registry=r,
        )
        self.tracked_blocks = Gauge(
            "continuum_kv_listener_tracked_blocks", "Blocks held by the chain tracker.", ["backend"], registry=r
        )
        self.retained_tokens = Gauge(
            "continuum_kv_listener_retained_tokens", "Token ids retained for detokenize.", ["backend"], registry=r
        )
        self.prefixes = Gauge(
            "continuum_kv_listener_prefixes", "Distinct (prefix key, tier) pairs announced.", ["backend"], registry=r
        )
        self.publish_buffer = Gauge(
            "continuum_kv_listener_publish_buffer",
            "Messages (events or block batches) waiting to be published or acknowledged.",
            registry=r,
        )
        self.bus_connected = Gauge("continuum_kv_listener_bus_connected", "1 while NATS is connected.", registry=r)
        self.loop_lag = Histogram(
            "continuum_kv_listener_event_loop_lag_seconds",
            "How much later than due the event loop ran a periodic timer (while the listener works"
            " through a burst it yields every millisecond; this says how well).",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.publish_latency = Histogram(
            "continuum_kv_listener_publish_seconds",
            "Time from event creation to its JetStream acknowledgement.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
            registry=r,
        )
        self.blocks = Counter(
            "continuum_kv_listener_blocks_total",
            "Block hashes published in version-2 batches, by kind (cleared counts AllCleared events).",
            ["backend", "kind"],
            registry=r,
        )
        self.block_batches = Counter(
            "continuum_kv_listener_block_batches_total",
            "Version-2 block batches published (keepalives included).",
            ["backend"],
            registry=r,
        )
        self.keepalives = Counter(
            "continuum_kv_listener_keepalives_total",
            "Empty block batches published as a liveness signal.",
            ["backend"],
            registry=r,
        )
        self.outstanding_acks = Gauge(
            "continuum_kv_listener_outstanding_acks", "JetStream publishes awaiting their acknowledgement.", registry=r
        )
        self.pauses = Counter(
            "continuum_kv_listener_backpressure_pauses_total",
            "Times a source stopped reading its engine because the publish queue was full.",
            ["backend"],
            registry=r,
        )
        self.paused_seconds = Counter(
            "continuum_kv_listener_backpressure_seconds_total",
            "Time sources spent paused by backpressure.",
            ["backend"],
            registry=r,
        )
        self.sse_clients = Gauge(
            "continuum_kv_listener_sse_clients", "Connected SSE consumers.", ["backend"], registry=r
        )
        self.sse_closed = Counter(
            "continuum_kv_listener_sse_closed_total",
            "SSE streams closed by the listener, by reason.",
            ["backend", "reason"],
            registry=r,
        )

    def drop(self, backend: str, reason: str, n: int = 1) -> None:
        self.dropped.labels(backend, _pick(reason, DROP_REASONS)).inc(n)

    def chain_event(self, backend: str, what: str, n: int) -> None:
        self.chain.labels(backend, _pick(what, CHAIN_EVENTS)).inc(n)

    def detok(self, backend: str, outcome: str, n: int = 1) -> None:
        self.detokenize.labels(backend, _pick(outcome, DETOKENIZE_OUTCOMES)).inc(n)

    def epoch(self, backend: str, reason: str) -> None:
        self.epochs.labels(backend, _pick(reason, EPOCH_REASONS)).inc()

    def replay(self, backend: str, outcome: str) -> None:
        self.replays.labels(backend, _pick(outcome, REPLAY_OUTCOMES)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of one sample (tests and the heartbeat read metrics through this)."""
        value = self.registry.get_sample_value(name, labels or {})
        return float(value or 0.0)
