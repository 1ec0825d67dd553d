"""The response cache as the ingress sees it: the `ResponseCacheHook` of `continuum_ingress.hooks`,
a `Component` (monitor task, hot reload, close) and the two admin routes (cache/admin.py).

The hook speaks the cache's own types: it only names the cache route of the ingress's API and
hands the client's body and headers over. The pipeline consults it before it computes a prefix
key or selects a backend, so a HIT never reaches a backend and never counts in the routing
metrics (docs/response-cache.md, "Wiring").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry
from starlette.routing import Route as HttpRoute

from continuum_common.config import RouterConfig
from continuum_ingress.cache.admin import CacheAdmin
from continuum_ingress.cache.facade import CACHE_OFF, CacheLookup, CacheRequest, ResponseCache, ResponseRecording
from continuum_ingress.cache.factory import build_response_cache
from continuum_ingress.cache.policy.eligibility import Route
from continuum_ingress.protocol.apis import Api
from continuum_ingress.shared_client import SharedClient

if TYPE_CHECKING:
    from continuum_common.redis_client import RedisClient
    from continuum_ingress.state import RequestState

ROUTES: dict[Api, Route] = {
    Api.CHAT: Route.CHAT,
    Api.COMPLETIONS: Route.COMPLETIONS,
    Api.MESSAGES: Route.ANTHROPIC,
    Api.RESPONSES: Route.RESPONSES,
}


class CacheHook:
    """`ResponseCacheHook` + `Component` over one `ResponseCache`."""

    def __init__(self, cache: ResponseCache, redis: SharedClient | None = None) -> None:
        self.cache = cache
        self.redis = redis
        self._client: RedisClient | None = redis.client if redis is not None else None

    @classmethod
    def from_config(
        cls,
        cfg: RouterConfig,
        *,
        registry: CollectorRegistry,
        redis: SharedClient | None = None,
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

    async def lookup(self, state: RequestState) -> CacheLookup:
        route = ROUTES.get(state.api)
        if route is None:  # embeddings: not cached, no X-Cache header
            return CACHE_OFF
        return await self.cache.lookup(CacheRequest(route, state.request.body, state.headers()))

    def recorder(self, state: RequestState, lookup: CacheLookup) -> ResponseRecording | None:
        return self.cache.recorder(lookup)

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
        return CacheAdmin(self.cache).routes()
