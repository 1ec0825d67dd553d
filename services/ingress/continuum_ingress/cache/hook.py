"""The response cache as the ingress sees it: the `ResponseCacheHook` of `continuum_ingress.hooks`,
a `Component` (monitor task, hot reload, close) and the two admin routes.

A thin adapter over `ResponseCache`: it maps the ingress's API to the cache's route, hands the
client's body and headers over, and converts the answers. The pipeline consults it before it
computes a prefix key or selects a backend, so a HIT never reaches a backend and never counts
in the routing metrics (docs/response-cache.md, "Wiring").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx
import orjson
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from continuum_common.config import RouterConfig
from continuum_common.redis_client import RedisClient
from continuum_ingress import hooks
from continuum_ingress.cache.errors import InvalidateRequestError
from continuum_ingress.cache.facade import CacheLookup, CacheRequest, CacheStatus, ResponseCache
from continuum_ingress.cache.factory import build_response_cache
from continuum_ingress.cache.policy.eligibility import Route
from continuum_ingress.cache.protocol.entry import CachedResponse
from continuum_ingress.errors import RequestError
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.errors import openai_error_body

if TYPE_CHECKING:
    from continuum_ingress.adapters.shared_redis import SharedRedis
    from continuum_ingress.state import RequestState

log = logging.getLogger(__name__)

ROUTES: dict[Api, Route] = {
    Api.CHAT: Route.CHAT,
    Api.COMPLETIONS: Route.COMPLETIONS,
    Api.MESSAGES: Route.ANTHROPIC,
}
_STATUS: dict[CacheStatus, hooks.CacheStatus | None] = {
    CacheStatus.HIT: "hit",
    CacheStatus.MISS: "miss",
    CacheStatus.BYPASS: "bypass",
    CacheStatus.OFF: None,
}
_NOT_CACHED = hooks.CacheLookup(None)
_SEMANTIC = (("X-Cache-Mode", "semantic"),)


def _replayable(entry: CachedResponse) -> hooks.CachedResponse:
    if entry.is_stream:
        # One chunk per SSE event; their concatenation is the original stream, byte for byte.
        return hooks.CachedResponse(entry.status, entry.headers, chunks=entry.events)
    return hooks.CachedResponse(entry.status, entry.headers, body=entry.body)


class CacheHook:
    """`ResponseCacheHook` + `Component` over one `ResponseCache`."""

    def __init__(self, cache: ResponseCache, redis: SharedRedis | None = None) -> None:
        self.cache = cache
        self.redis = redis
        self._client: RedisClient | None = redis.client if redis is not None else None

    @classmethod
    def from_config(
        cls,
        cfg: RouterConfig,
        *,
        registry: CollectorRegistry,
        redis: SharedRedis | None = None,
        monitor_interval_s: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> CacheHook:
        """Build the cache on the app's registry (its metric names are registered here, once)
        with the process's shared Redis client."""
        cache = build_response_cache(
            cfg,
            registry=registry,
            redis_client=redis.client if redis is not None else None,
            http_client=http_client,
            monitor_interval_s=monitor_interval_s,
        )
        return cls(cache, redis)

    # ResponseCacheHook -------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return self.cache.enabled

    async def lookup(self, state: RequestState) -> hooks.CacheLookup:
        route = ROUTES.get(state.api)
        if route is None:  # embeddings, responses: not cached, no X-Cache header
            return _NOT_CACHED
        found = await self.cache.lookup(CacheRequest(route, state.request.body, state.headers()))
        entry = found.response
        return hooks.CacheLookup(
            _STATUS[found.status],
            _replayable(entry) if entry is not None else None,
            token=found,
            headers=_SEMANTIC if entry is not None and entry.mode == "semantic" else (),
        )

    def recorder(self, state: RequestState, lookup: hooks.CacheLookup) -> hooks.ResponseRecorder | None:
        token = lookup.token
        if not isinstance(token, CacheLookup):
            return None
        # ResponseRecording already has the recorder's shape (feed / commit / abort).
        return self.cache.recorder(token)

    # Component ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.cache.start()

    def reload(self, config: RouterConfig) -> None:
        """Every field but `response_cache.backend` (its change is logged: restart needed).
        The shared client reloads first (it is an earlier component); pass a swapped one on."""
        client = self.redis.client if self.redis is not None else None
        swapped = client is not None and client is not self._client
        self._client = client
        self.cache.reload(config, redis_client=client if swapped else None)

    async def aclose(self) -> None:
        await self.cache.aclose()

    # admin -------------------------------------------------------------------------------
    def admin_routes(self) -> Sequence[HttpRoute]:
        """Mounted under /admin (behind the admin token) by the composition root."""
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
