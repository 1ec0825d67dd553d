"""Ingress-side metrics of the Gemini context cache, on the ingress app's registry. Registered
only when `gemini_context_cache.enabled` (the disabled feature creates nothing).

Names start with `continuum_ingress_gemini_context_cache_` so they never collide with the
service's `continuum_gemini_context_cache_*` (which reports the fleet-wide sums of the same
request outcomes, sent by every ingress replica). `backend` values are configured names."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from continuum_common.wire.gemini import RequestOutcome

P = "continuum_ingress_gemini_context_cache_"
LOOKUP_FAILURES = ("timeout", "no_responders", "not_connected", "bad_reply", "overloaded", "error")
DROP_REASONS = ("not_connected", "too_large", "queue_full", "publish_failed", "no_responders", "timeout")
MESSAGE_KINDS = ("ensure", "drop", "usage")


class GeminiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            P + "requests",
            "Chat requests to type: gemini backends by cache outcome",
            ["backend", "result"],
            registry=registry,
        )
        self.ineligible = Counter(
            P + "ineligible", "Requests that could not use the context cache, by reason", ["reason"], registry=registry
        )
        self.cached_tokens = Counter(
            P + "cached_tokens",
            "Prompt tokens served from a cache (usageMetadata.cachedContentTokenCount; explicit and implicit)",
            ["backend"],
            registry=registry,
        )
        self.lookups = Counter(
            P + "lookups", "Cache lookups by where the answer came from", ["source"], registry=registry
        )
        self.lookup_failures = Counter(
            P + "lookup_failures",
            "Lookups answered as a miss because the service did not answer",
            ["reason"],
            registry=registry,
        )
        self.lookup_seconds = Histogram(
            P + "lookup_seconds",
            "Lookup round trips to the gemini-cache service",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=registry,
        )
        self.stale = Counter(
            P + "stale_references",
            "Cache references Google rejected (expired or deleted); the request was resent without it",
            ["backend"],
            registry=registry,
        )
        self.messages = Counter(P + "messages", "Messages queued for the bus", ["kind"], registry=registry)
        self._dropped = Counter(P + "dropped", "Bus messages dropped", ["kind", "reason"], registry=registry)
        self.usage_lost_requests = Counter(
            P + "usage_lost_requests",
            "Requests whose outcomes were in a usage report the gemini-cache service never acknowledged",
            registry=registry,
        )
        for reason in LOOKUP_FAILURES:
            self.lookup_failures.labels(reason)
        for kind in MESSAGE_KINDS:
            self.messages.labels(kind)
        for reason in DROP_REASONS:  # usage losses are what an operator alerts on
            self._dropped.labels("usage", reason)

    def outcome(self, backend: str, outcome: RequestOutcome) -> None:
        self.requests.labels(backend, outcome.value).inc()

    def lookup_failure(self, reason: str) -> None:
        self.lookup_failures.labels(reason).inc()

    def dropped(self, kind: str, reason: str) -> None:
        self._dropped.labels(kind if kind in MESSAGE_KINDS else "other", reason).inc()
