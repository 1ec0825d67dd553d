"""OpenTelemetry set-up shared by every service, without touching OTel's global provider.

Each service builds one `Tracing` in its composition root and passes it down. Disabled tracing
is a no-op tracer (spans cost almost nothing). Context crosses process boundaries as a W3C
`traceparent` header: HTTP headers between ingress and backends, NATS message headers between
listener and indexer. The OTLP exporter's batch processor runs its own export thread; that is
the SDK's design, not I/O of ours, and it is bounded (max queue size, dropped spans counted by
the SDK).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from continuum_common.config.router import TracingConfig

_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """A tracer plus W3C trace-context helpers for one service."""

    def __init__(self, cfg: TracingConfig, service: str) -> None:
        self._provider: TracerProvider | None = None
        if cfg.enabled:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self._provider = TracerProvider(
                resource=Resource.create({"service.name": f"{cfg.service_name}-{service}"}),
                sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)),
            )
            exporter = OTLPSpanExporter(endpoint=cfg.otlp_endpoint, timeout=5)
            self._provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=2048))
            self.tracer: trace.Tracer = self._provider.get_tracer("continuum")
        else:
            self.tracer = trace.NoOpTracer()

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    @staticmethod
    def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
        """Write `traceparent` (and `tracestate`) of the current or given context."""
        _PROPAGATOR.inject(headers, context=context)

    @staticmethod
    def extract(headers: Mapping[str, str] | None) -> Context:
        return _PROPAGATOR.extract(dict(headers or {}))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
