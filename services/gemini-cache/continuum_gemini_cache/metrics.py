"""Prometheus metrics of the gemini-cache service, in a per-app registry (docs/gemini-cache.md
lists them). `backend` label values are the configured `type: gemini` backend names only."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from continuum_common.loop_lag import LAG_BUCKETS

P = "continuum_gemini_context_cache_"

CREATE_FAILURE_REASONS = (
    "rejected",  # 400: negative entry recorded
    "unsupported",  # 404/405/501 on the create endpoint: negative entry recorded
    "auth",  # 400 API_KEY_INVALID, 401, 403
    "rate_limited",  # 429
    "http_4xx",
    "http_5xx",
    "timeout",
    "transport",
    "bad_response",
    "store",
)
DROP_REASONS = ("bad_message", "ensure_queue_full", "maintenance_queue_full", "overloaded", "unknown_backend")


class Metrics:
    def __init__(self, backends: list[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            P + "requests",
            "Chat requests to type: gemini backends by outcome, as reported by the ingress",
            ["backend", "result"],
            registry=r,
        )
        self.cached_tokens = Counter(
            P + "cached_tokens",
            "usageMetadata.cachedContentTokenCount summed over responses (explicit and implicit caching)",
            ["backend"],
            registry=r,
        )
        self.lookups = Counter(P + "lookups", "Lookups answered by this service", ["backend", "result"], registry=r)
        self.ensures = Counter(
            P + "ensures", "Ensure requests handled by this replica, by outcome", ["backend", "outcome"], registry=r
        )
        self.creates = Counter(P + "creates", "cachedContents created", ["backend"], registry=r)
        self.create_failures = Counter(
            P + "create_failures", "cachedContents create attempts that failed", ["backend", "reason"], registry=r
        )
        self.evictions = Counter(
            P + "evictions",
            "Entries evicted over max_entries (LRU), each followed by a DELETE",
            ["backend"],
            registry=r,
        )
        self.removals = Counter(P + "removals", "Records removed for other reasons", ["backend", "reason"], registry=r)
        self.extends = Counter(P + "extends", "extend_on_hit PATCH calls", ["backend", "result"], registry=r)
        self.deletes = Counter(P + "deletes", "Best-effort DELETE calls", ["backend", "result"], registry=r)
        self.dropped = Counter(P + "dropped", "Bus messages or jobs dropped", ["reason"], registry=r)
        self.loop_lag = Histogram(
            P + "event_loop_lag_seconds",
            "How much later than due the event loop ran a periodic timer",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.store_errors = Counter(P + "store_errors", "State store operations that failed", ["op"], registry=r)
        self.entries = Gauge(P + "entries", "Live entries (shared state, last observed)", ["backend"], registry=r)
        self.negative_entries = Gauge(
            P + "negative_entries", "Live negative entries (shared state, last observed)", ["backend"], registry=r
        )
        self.in_flight = Gauge(P + "in_flight", "Creates in flight on this replica", registry=r)
        self.google_seconds = Histogram(
            P + "google_request_seconds",
            "Latency of cachedContents calls to Google",
            ["op"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        # Pre-create every allowed series so dashboards see zeros rather than gaps.
        for backend in backends:
            self.creates.labels(backend)
            self.evictions.labels(backend)
            self.cached_tokens.labels(backend)
            for result in ("hit", "miss", "negative", "ineligible"):
                self.requests.labels(backend, result)
        for reason in DROP_REASONS:
            self.dropped.labels(reason)
