"""`/metrics` (Prometheus text) and `/healthz` for the standalone service."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from continuum_common.exposition import render


def http_app(registry: CollectorRegistry, health: Callable[[], Awaitable[dict[str, bool]]]) -> Starlette:
    async def metrics(_: Request) -> Response:
        return Response(await render(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        checks = await health()
        ok = all(checks.values())
        return JSONResponse({"status": "ok" if ok else "degraded", **checks}, status_code=200 if ok else 503)

    return Starlette(routes=[Route("/metrics", metrics), Route("/healthz", healthz)])
