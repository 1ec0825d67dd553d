"""Trace context crosses a header map and back; disabled tracing is a no-op."""

from __future__ import annotations

from opentelemetry import trace

from continuum_common.config.router import TracingConfig
from continuum_common.tracing import Tracing


def test_traceparent_round_trip_with_tracing_enabled() -> None:
    tracing = Tracing(TracingConfig(enabled=True, otlp_endpoint="http://127.0.0.1:9/v1/traces"), "test")
    try:
        with tracing.tracer.start_as_current_span("publish") as span:
            headers: dict[str, str] = {}
            tracing.inject(headers)
            trace_id = span.get_span_context().trace_id
        assert headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
        ctx = tracing.extract(headers)
        with tracing.tracer.start_as_current_span("apply", context=ctx) as child:
            assert child.get_span_context().trace_id == trace_id
    finally:
        tracing.shutdown()


def test_disabled_tracing_is_noop_and_injects_nothing() -> None:
    tracing = Tracing(TracingConfig(), "test")
    assert not tracing.enabled
    with tracing.tracer.start_as_current_span("x") as span:
        headers: dict[str, str] = {}
        tracing.inject(headers)
    assert headers == {} and not span.get_span_context().is_valid
    assert isinstance(tracing.tracer, trace.NoOpTracer)
