"""A real OTLP/HTTP trace receiver for tests: `POST /v1/traces` with the protobuf export
(`opentelemetry-proto`'s ExportTraceServiceRequest), decoded into flat span records."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from continuum_ingress.server import RunningServer

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class SpanRecord:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, object]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)


@dataclass
class Receiver:
    url: str = ""
    spans: list[SpanRecord] = field(default_factory=list)
    exports: int = 0

    def named(self, prefix: str) -> list[SpanRecord]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def trace(self, trace_id: str) -> list[SpanRecord]:
        return [s for s in self.spans if s.trace_id == trace_id]


def _value(any_value: object) -> object:
    field_name = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(any_value, field_name) if field_name else None


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()

    async def traces(request: Request) -> Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.body())
        receiver.exports += 1
        for resource_spans in export.resource_spans:
            service = next(
                (str(_value(a.value)) for a in resource_spans.resource.attributes if a.key == "service.name"), ""
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    receiver.spans.append(
                        SpanRecord(
                            service=service,
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return Response(body, media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    async with RunningServer(app) as server:
        receiver.url = f"{server.url}/v1/traces"
        yield receiver
