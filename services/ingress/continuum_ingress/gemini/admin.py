"""`GET /admin/gemini-context-cache/stats` and `POST /admin/gemini-context-cache/clear` (mounted
under /admin, behind the admin token). The answers are the gemini-cache service's, fetched over
NATS (`continuum.gemini.admin.*`); the seed's `{"success": false, "error": "Gemini context cache
is not enabled"}` when the feature is off (no service runs then)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from continuum_common.wire.gemini import not_enabled_reply
from continuum_ingress.gemini.adapters.bus import ServiceUnavailable
from continuum_ingress.gemini.context_cache import GeminiContextCache

STATS_PATH = "/gemini-context-cache/stats"
CLEAR_PATH = "/gemini-context-cache/clear"


def admin_routes(cache: GeminiContextCache | None) -> list[BaseRoute]:
    if cache is None:
        return [Route(STATS_PATH, _disabled_stats, methods=["GET"]), Route(CLEAR_PATH, _disabled, methods=["POST"])]

    async def stats(request: Request) -> Response:
        try:
            return JSONResponse(await cache.stats())
        except ServiceUnavailable as exc:
            return JSONResponse({"enabled": True, "success": False, "error": str(exc)}, status_code=503)

    async def clear(request: Request) -> Response:
        try:
            return JSONResponse(await cache.clear())
        except ServiceUnavailable as exc:
            return JSONResponse({"success": False, "error": str(exc)}, status_code=503)

    return [Route(STATS_PATH, stats, methods=["GET"]), Route(CLEAR_PATH, clear, methods=["POST"])]


async def _disabled_stats(request: Request) -> Response:
    return JSONResponse({"enabled": False, **not_enabled_reply()})


async def _disabled(request: Request) -> Response:
    return JSONResponse(not_enabled_reply())
