"""The listener's HTTP surface: `GET /events/{backend}` (SSE), `GET /healthz`, `GET /metrics`.

The SSE feed carries version-1 prefix-key events, so it serves the sources that publish them
(`publish: prefix | both`); a blocks-only source answers 404 with a body that says so.

Served by `continuum_common.asgi_server.EmbeddedServer` inside the listener's own event loop;
the app owns signals (SIGTERM drains).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from continuum_common.exposition import render
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.sse_hub import SseHub


def error(status: int, message: str, kind: str) -> JSONResponse:
    """OpenAI-style error body."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def build_app(
    hub: SseHub,
    metrics: ListenerMetrics,
    health: Callable[[], dict[str, Any]],
    *,
    sse_backends: frozenset[str] | None = None,
) -> Starlette:
    served = hub.backends if sse_backends is None else sse_backends

    async def events(request: Request) -> Response:
        backend = request.path_params["backend"]
        if backend not in hub.backends:
            return error(404, f"unknown backend {backend!r}", "not_found_error")
        if backend not in served:
            message = (
                f"backend {backend!r} publishes block batches only (publish: blocks); this feed "
                "carries prefix-key events (publish: prefix or both)"
            )
            return error(404, message, "not_found_error")
        if hub.draining:
            return error(503, "listener is draining", "unavailable_error")
        last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        subscriber = hub.subscribe(backend, last)
        return StreamingResponse(
            hub.stream(subscriber),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def healthz(_request: Request) -> Response:
        body = health()
        return JSONResponse(body, 503 if body.get("status") == "draining" else 200)

    async def prometheus(_request: Request) -> Response:
        return Response(await render(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(_request: Request, _exc: Exception) -> Response:
        return error(404, "not found", "not_found_error")

    async def not_allowed(_request: Request, _exc: Exception) -> Response:
        return error(405, "method not allowed", "invalid_request_error")

    return Starlette(
        routes=[
            Route("/events/{backend}", events, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_allowed},
    )
