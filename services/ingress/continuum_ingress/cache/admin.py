"""The response cache's admin routes (seed: `GET /admin/response-cache/stats`,
`POST /admin/response-cache/invalidate`), mounted under /admin behind the admin token by the
composition root."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from continuum_ingress.cache.errors import InvalidateRequestError
from continuum_ingress.cache.facade import ResponseCache
from continuum_ingress.errors import RequestError
from continuum_ingress.protocol.errors import openai_error_body


class CacheAdmin:
    def __init__(self, cache: ResponseCache) -> None:
        self.cache = cache

    def routes(self) -> Sequence[HttpRoute]:
        return (
            HttpRoute("/response-cache/stats", self.stats, methods=["GET"]),
            HttpRoute("/response-cache/invalidate", self.invalidate, methods=["POST"]),
        )

    async def stats(self, request: Request) -> Response:
        return JSONResponse(await self.cache.stats())

    async def invalidate(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return _bad_request('The body must be JSON: {"clear_all": true}.', "invalid_json")
        try:
            result = await self.cache.invalidate(body)
        except InvalidateRequestError as exc:
            return _bad_request(str(exc), "invalid_value", "clear_all")
        return JSONResponse(result)


def _bad_request(message: str, code: str, param: str | None = None) -> Response:
    error = RequestError(400, message, kind="invalid_request", param=param, code=code)
    return Response(openai_error_body(error), status_code=400, media_type="application/json")
