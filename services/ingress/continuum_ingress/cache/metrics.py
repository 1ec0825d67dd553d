"""The response cache's Prometheus metrics, registered on the registry the ingress owns.

Names and labels are the seed's: `continuum_response_cache_requests_total{result}` with
result ∈ {hit, miss, skip}, `continuum_cache_redis_latency_seconds{operation}`,
`continuum_cache_redis_errors_total` and `continuum_cache_fallback_active`. The fallback
episode counter and the embedding failure counter are Continuum's additions (the gauge alone
misses an episode shorter than a scrape; the seed has no semantic-cache metric); label values
are a fixed allow-list too.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

RESULTS: Final = ("hit", "miss", "skip")
REDIS_OPERATIONS: Final = ("get", "set", "delete", "clear", "ping", "stats")
EMBEDDING_FAILURES: Final = ("timeout", "error")
LATE_COMMITS: Final = ("stored", "not_stored", "skipped")
# Loopback Redis answers in ~100 µs, a LAN one in 0.1-2 ms, the command timeout is ~1 s.
_LATENCY_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "continuum_response_cache_requests_total",
            "Response-cache lookups by result (hit, miss, skip = not eligible)",
            ["result"],
            registry=registry,
        )
        self.redis_latency = Histogram(
            "continuum_cache_redis_latency_seconds",
            "Latency of response-cache Redis commands",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.redis_errors = Counter(
            "continuum_cache_redis_errors_total",
            "Failed response-cache Redis commands (connection, timeout or other)",
            registry=registry,
        )
        self.fallback_active = Gauge(
            "continuum_cache_fallback_active",
            "1 while Redis is unreachable and the response cache serves from its in-memory fallback (or bypasses)",
            registry=registry,
        )
        self.fallback_episodes = Counter(
            "continuum_cache_fallback_episodes_total",
            "Times the response cache switched from Redis to its in-memory fallback (or bypass)",
            registry=registry,
        )
        self.embedding_failures = Counter(
            "continuum_semantic_cache_embedding_failures_total",
            "Semantic-cache embedding calls that failed or timed out (served as a plain miss)",
            ["reason"],
            registry=registry,
        )
        self.late_commits = Counter(
            "continuum_response_cache_late_commits_total",
            "Streams whose client closed the connection after the terminal event, before the upstream's end: "
            "stored in the background, not stored, or skipped (too many such stores pending)",
            ["outcome"],
            registry=registry,
        )
        # Pre-create every allowed series so dashboards see zeros, not gaps.
        self._result = {r: self.requests.labels(result=r) for r in RESULTS}
        self._latency = {op: self.redis_latency.labels(operation=op) for op in REDIS_OPERATIONS}
        for reason in EMBEDDING_FAILURES:
            self.embedding_failures.labels(reason=reason)
        self._late = {o: self.late_commits.labels(outcome=o) for o in LATE_COMMITS}
        self.fallback_active.set(0)

    def count_late_commit(self, outcome: str) -> None:
        self._late[outcome].inc()

    def count_result(self, result: str) -> None:
        self._result[result].inc()

    def observe_redis(self, operation: str, seconds: float) -> None:
        self._latency[operation].observe(seconds)
