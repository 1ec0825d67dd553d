"""Prometheus metrics of one ingress app (its own CollectorRegistry, never the global one).

Seed names and label allow-lists:
* continuum_prefix_routing_requests_total{strategy=prefix_hash|overflow|fallback}: once per
  selection in which PrefixAwareHash ran;
* continuum_prefix_routing_backend_distribution{backend}: live in-flight requests per backend
  (the admin stats' `backend_distribution`), read from the pool at scrape time;
* continuum_kv_index_routing_decisions_total{decision=kv_aware|fallback,tier}, and
  continuum_kv_index_overlap_score: recorded by the selection pipeline when a scorer ran.
Label values are bounded: endpoints and outcomes are enums, backends are configured names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from continuum_common.loop_lag import LAG_BUCKETS
from continuum_common.ring import RouteLabel
from continuum_ingress.hyperloglog import HyperLogLog
from continuum_ingress.plain_metrics import PlainCounter, PlainHistogram
from continuum_ingress.policy.scorer import HoldingTier
from continuum_ingress.pool import BackendPool
from continuum_ingress.protocol.apis import Api

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ENDPOINTS = (*(a.value for a in Api), "models", "admin")
# A streamed request's way to its first chunk (IngressMetrics.stream_stages).
STREAM_STAGES = ("read", "route", "backend", "to_client")
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
REJECT_REASONS = ("invalid_json", "invalid_request", "too_large", "unknown_model", "no_backend")
BACKEND_OUTCOMES = (
    "success",
    "client_error",
    "server_error",
    "connect_error",
    "timeout",
    "stream_error",
    "backend_down",
    "cancelled",
)
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")
RETRY_REASONS = (
    "connect_error",
    "server_error",
    "first_byte_timeout",
    "backend_down",
    "stream_error",
    "response_not_found",
)


class PoolCollector(Collector):
    """Backend gauges read from the live pool at scrape time (no per-request cost)."""

    def __init__(self, pool: BackendPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        dist = GaugeMetricFamily(
            "continuum_prefix_routing_backend_distribution",
            "In-flight requests per backend from this replica (prefix-routing load distribution)",
            labels=["backend"],
        )
        healthy = GaugeMetricFamily(
            "continuum_backend_healthy", "1 when the backend may take traffic", labels=["backend"]
        )
        circuit = GaugeMetricFamily(
            "continuum_backend_circuit_state", "Circuit breaker: 0 closed, 1 half-open, 2 open", labels=["backend"]
        )
        latency = GaugeMetricFamily(
            "continuum_backend_latency_ewma_seconds", "EWMA of backend response latency", labels=["backend"]
        )
        success = GaugeMetricFamily(
            "continuum_backend_success_rate", "Success rate over the last 100 outcomes", labels=["backend"]
        )
        shared = GaugeMetricFamily(
            "continuum_backend_other_replicas_in_flight",
            "In-flight requests per backend that the other ingress replicas last reported (shared load view)",
            labels=["backend"],
        )
        for state in self._pool.states():
            dist.add_metric([state.name], state.local_in_flight)
            healthy.add_metric([state.name], 1.0 if state.healthy and state.breaker_state == 0 else 0.0)
            circuit.add_metric([state.name], int(state.breaker_state))
            if state.latency is not None:
                latency.add_metric([state.name], state.latency)
            success.add_metric([state.name], state.success_rate)
            shared.add_metric([state.name], state.remote_in_flight)
        yield from (dist, healthy, circuit, latency, success, shared)


class PrefixRoutingStats:
    """Counters behind GET /admin/prefix-routing/stats (since process start)."""

    def __init__(self) -> None:
        self.decisions: dict[RouteLabel, int] = dict.fromkeys(RouteLabel, 0)
        self.unique = HyperLogLog()

    @property
    def total(self) -> int:
        return sum(self.decisions.values())


class IngressMetrics:
    def __init__(self, pool: BackendPool) -> None:
        self.registry = CollectorRegistry()
        self.prefix_stats = PrefixRoutingStats()
        self._routing_metrics(self.registry)
        self._request_metrics(self.registry)
        self.registry.register(PoolCollector(pool))

    def _routing_metrics(self, r: CollectorRegistry) -> None:
        # The per-request metrics are plain_metrics types (no lock per increment).
        self._prefix = PlainCounter(
            "continuum_prefix_routing_requests",
            "PrefixAwareHash selections by decision",
            ["strategy"],
            registry=r,
            preset=[(label.value,) for label in RouteLabel],
        )
        self._prefix_labels = {label: (label.value,) for label in RouteLabel}
        decisions = Counter(
            "continuum_kv_index_routing_decisions",
            "Selections in which the KV scorer ran",
            ["decision", "tier"],
            registry=r,
        )
        self._kv_decisions = {
            (d, t.value): decisions.labels(d, t.value) for d in ("kv_aware", "placed", "fallback") for t in HoldingTier
        }
        self.kv_overlap = Histogram(
            "continuum_kv_index_overlap_score",
            "Best composite score of kv_aware decisions",
            buckets=(0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            registry=r,
        )
        self.kv_scorer_errors = Counter(
            "continuum_kv_scorer_errors", "Scorer prepare() failures or timeouts (strategy used)", registry=r
        )
        self.kv_selection_seconds = Histogram(
            "continuum_kv_selection_seconds",
            "Time the Tier 4 selector took for one selection (keys, index reads, the choice)",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=r,
        )
        self.cache_control_injected = Counter(
            "continuum_anthropic_cache_control_injected", "Anthropic requests given a cache_control marker", registry=r
        )
        self.salt_echo = Counter("continuum_salt_echo_requests", "Requests sent with a cache_salt", registry=r)

    def _request_metrics(self, r: CollectorRegistry) -> None:
        self._requests = PlainCounter(
            "continuum_ingress_requests",
            "Client requests by endpoint and status class",
            ["endpoint", "status"],
            registry=r,
            preset=[(e, s) for e in ENDPOINTS for s in STATUS_CLASSES],
        )
        self._duration = PlainHistogram(
            "continuum_ingress_request_duration_seconds",
            "Time to the end of the response, per endpoint",
            ["endpoint"],
            LATENCY_BUCKETS,
            registry=r,
            preset=[(e,) for e in ENDPOINTS],
        )
        self._stages = PlainHistogram(
            "continuum_ingress_stream_stage_seconds",
            "A streamed request's way to its first chunk, by stage: read (from its head to its"
            " body read and parsed), route (to the request sent to the backend that served it:"
            " caches, routing, rewrites, failed attempts), backend (to that backend's first chunk"
            " read), to_client (to that chunk handed to the client's connection)",
            ["stage"],
            STAGE_BUCKETS,
            registry=r,
            preset=[(s,) for s in STREAM_STAGES],
        )
        self._loop_lag = PlainHistogram(
            "continuum_ingress_event_loop_lag_seconds",
            "How much later than due the event loop ran a periodic timer: what a request arriving"
            " then waited before the process read it",
            [],
            LAG_BUCKETS,
            registry=r,
            preset=[()],
        )
        rejected = Counter(
            "continuum_ingress_rejected_requests",
            "Requests refused before reaching a backend",
            ["endpoint", "reason"],
            registry=r,
        )
        self._rejected = {(e, x): rejected.labels(e, x) for e in ENDPOINTS for x in REJECT_REASONS}
        self._backend_requests = PlainCounter(
            "continuum_backend_requests", "Upstream attempts by backend and outcome", ["backend", "outcome"], registry=r
        )
        retries = Counter("continuum_ingress_retries", "Attempts retried on another backend", ["reason"], registry=r)
        self._retries = {x: retries.labels(x) for x in RETRY_REASONS}
        self.client_disconnects = Counter(
            "continuum_ingress_client_disconnects", "Requests whose client went away (upstream cancelled)", registry=r
        )
        reloads = Counter("continuum_config_reloads", "Configuration reloads", ["result"], registry=r)
        self._reloads = {True: reloads.labels("ok"), False: reloads.labels("rejected")}

    # -- recording -------------------------------------------------------------------------
    def route(self, label: RouteLabel) -> None:
        self._prefix.inc(self._prefix_labels[label])
        self.prefix_stats.decisions[label] += 1

    def prefix_seen(self, prefix_key: bytes) -> None:
        self.prefix_stats.unique.add(prefix_key)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self._requests.inc((endpoint, STATUS_CLASSES[min(max(status // 100, 2), 5) - 2]))
        self._duration.observe((endpoint,), seconds)

    def stream_stages(self, read: float, route: float, backend: float, to_client: float) -> None:
        """The stages of a streamed request up to its first chunk (seconds; STREAM_STAGES)."""
        stages = self._stages
        stages.observe(("read",), read)
        stages.observe(("route",), route)
        stages.observe(("backend",), backend)
        stages.observe(("to_client",), to_client)

    def loop_lag(self, seconds: float) -> None:
        self._loop_lag.observe((), seconds)

    def rejected(self, endpoint: str, reason: str) -> None:
        self._rejected[(endpoint, reason)].inc()

    def backend(self, backend: str, outcome: str) -> None:
        self._backend_requests.inc((backend, outcome))

    def retry(self, reason: str) -> None:
        self._retries[reason].inc()

    def kv_decision(self, decision: str, tier: HoldingTier, score: float | None = None) -> None:
        self._kv_decisions[(decision, tier.value)].inc()
        if score is not None:
            self.kv_overlap.observe(score)

    def reload(self, ok: bool) -> None:
        self._reloads[ok].inc()


class LoadShareMetrics:
    """The shared load view between ingress processes (load_share.py)."""

    def __init__(self, registry: CollectorRegistry, peers: Callable[[], float]) -> None:
        reports = Counter(
            "continuum_ingress_load_reports",
            "Load reports exchanged with the other ingress processes (a NATS message, or one "
            "datagram per sibling worker)",
            ["direction"],
            registry=registry,
        )
        self.sent = reports.labels("sent")
        self.received = reports.labels("received")
        self.dropped = Counter(
            "continuum_ingress_load_reports_dropped",
            "Load reports not sent or not used (bus_down, publish_failed, peer_busy, peer_gone, "
            "too_large, not_open, decode, reordered)",
            ["reason"],
            registry=registry,
        )
        self.expired = Counter(
            "continuum_ingress_load_peers_expired",
            "Other processes forgotten because no load report arrived within the staleness bound",
            registry=registry,
        )
        gauge = Gauge(
            "continuum_ingress_load_peers",
            "Other ingress processes (replicas, sibling workers) whose load this one adds to its own",
            registry=registry,
        )
        gauge.set_function(peers)


class WorkerScrapeMetrics:
    """`/metrics` of a worker answers for every worker of its `serve` (adapters/worker_metrics.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "continuum_ingress_worker_scrape_failures",
            "Sibling workers (or the supervisor) whose metrics a scrape of this worker could not include",
            registry=registry,
        )


HANDOFF_FAILURES = ("peer_busy", "peer_gone", "send_failed", "not_open", "adopt_failed")


class RebalanceMetrics:
    """Client connections moved between the workers of one `serve` (continuum_ingress.rebalancer)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        moved = Counter(
            "continuum_ingress_connections_moved",
            "Idle keep-alive client connections handed to a sibling worker (out) or taken from one (in)",
            ["direction"],
            registry=registry,
        )
        self.moved_out, self.moved_in = moved.labels("out"), moved.labels("in")
        failures = Counter(
            "continuum_ingress_connection_handoff_failures",
            "Connection counts or hand-overs that did not reach a sibling (the connections stayed), "
            "and handed-over connections this worker could not serve",
            ["reason"],
            registry=registry,
        )
        self.failures = {reason: failures.labels(reason) for reason in HANDOFF_FAILURES}


class SupervisorMetrics:
    """The `serve` supervisor's own metrics (supervisor.py), included in every worker's `/metrics`."""

    def __init__(self, running: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        self.restarts = Counter(
            "continuum_ingress_worker_restarts",
            "Worker processes restarted after they died",
            ["worker"],
            registry=self.registry,
        )
        gauge = Gauge(
            "continuum_ingress_workers_running", "Worker processes of this serve running now", registry=self.registry
        )
        gauge.set_function(running)
