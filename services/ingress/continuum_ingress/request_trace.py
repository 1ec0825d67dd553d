"""The spans of one client request, built only when tracing is on (`tracing.enabled`).

One trace per request: a SERVER span for the request (continuing the client's `traceparent`
when it sent one), INTERNAL children for the response-cache lookup and each backend selection,
and a CLIENT span per upstream attempt whose context the backend receives as its `traceparent`
(replacing the client's), so the engine's own spans join the same trace. Attributes name the
API, model, backend, decision and status; never prompt text, keys or bodies.

With tracing off the endpoint keeps no RequestTrace at all (`state.trace is None`) and every
hook is one `is None` test, so tracing costs nothing measurable when disabled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from continuum_common.tracing import Tracing

_TRACE_HEADERS = (b"traceparent", b"tracestate")


class RequestTrace:
    __slots__ = ("_context", "_tracing", "root")

    def __init__(self, tracing: Tracing, name: str, headers: Sequence[tuple[bytes, bytes]]) -> None:
        self._tracing = tracing
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in _TRACE_HEADERS}
        parent = tracing.extract(carrier)
        self.root = tracing.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes={"continuum.api": name}
        )
        self._context = trace.set_span_in_context(self.root, parent)

    def describe(self, model: str, stream: bool, request_id: str) -> RequestTrace:
        """Name the parsed request on its span; returns self."""
        self.root.set_attribute("gen_ai.request.model", model)
        self.root.set_attribute("continuum.stream", stream)
        self.root.set_attribute("continuum.request_id", request_id)
        return self

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[Span]:
        """An INTERNAL child of the request span (the cache lookup, a selection)."""
        span = self._tracing.tracer.start_span(name, context=self._context)
        try:
            yield span
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    def upstream(
        self, backend: str, attempt: int, headers: list[tuple[str, str]]
    ) -> tuple[Span, list[tuple[str, str]]]:
        """A CLIENT span for one attempt, and the upstream headers carrying its context."""
        span = self._tracing.tracer.start_span(
            f"upstream {backend}",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes={"continuum.backend": backend, "continuum.attempt": attempt},
        )
        carrier: dict[str, str] = {}
        self._tracing.inject(carrier, trace.set_span_in_context(span, self._context))
        kept = [(k, v) for k, v in headers if k not in ("traceparent", "tracestate")]
        return span, kept + list(carrier.items())

    def end(self, status: int) -> None:
        self.root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.root.set_status(Status(StatusCode.ERROR))
        self.root.end()


def end_upstream(span: Span, status: int | None, outcome: str) -> None:
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    span.set_attribute("continuum.outcome", outcome)
    if outcome not in ("success", "client_error"):
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()
