"""Composition root of the ingress: builds every object, owns the lifespan TaskGroup
(config watcher, health checker, maintenance) and the shutdown.

    app = IngressApp("config.yaml")            # or a RouterConfig
    uvicorn.run(app.asgi, ...)                 # or continuum_ingress.server.serve()

The response cache (Tier 2/3, `cache.hook.CacheHook`) is built here from the configuration
unless a `response_cache` hook is passed, and the process's one Redis client (`app.redis`, a
`SharedRedis`; pass `redis=` to share one built outside) too. The Tier 4 KV scorer (`kv/`) is
built here when `kv_cache_index.enabled` and no `scorer` is passed; a Redis KV index reads
through `app.redis`, so the response cache and the KV index share one pool, and a memory one is
built by `embedded_index` (kv/embedded.py: the launcher passes the indexer's embedded feed). The shared load view
(`load_view.py`) is built here whenever the process has peers: sibling workers (`worker=`, the
seat a `serve` supervisor gave this process) or other replicas over NATS; a worker's `/metrics`
answers for every worker of its `serve` (adapters/worker_metrics.py).

Seams for other components are constructor arguments: `response_cache` (Tier 2/3 hook),
`scorer` (Tier 4 BackendScorer), `rewriters` (per-attempt body rewrites), `dialects` (per
backend-type upstream dialects), `components` (start / reload / aclose with the app),
`extra_admin_routes` (mounted under /admin, behind the admin token) and `transport` (the
upstream HTTP transport of every backend, transport.py; default the HTTP/1.1 pool of
adapters/h1.py). The Gemini dialect and context-cache client (docs/gemini-ingress.md) are built
here from the configuration (`gemini.wiring.build_gemini`). Whatever talks on NATS (KV routing,
load reports, the Gemini client) shares the process's one connection (adapters/nats_link.py);
`nats_url` overrides `bus.url` (`up`'s embedded NATS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route, Router

from continuum_common.config import RouterConfig, load_router_config
from continuum_common.config.secrets import read_secret
from continuum_common.loop_lag import measure_loop_lag
from continuum_common.tracing import Tracing
from continuum_ingress.adapters.health import HealthChecker
from continuum_ingress.adapters.nats_link import NatsLink
from continuum_ingress.adapters.shared_redis import SharedRedis
from continuum_ingress.adapters.upstream import ClientSet
from continuum_ingress.adapters.worker_metrics import WorkerMetrics
from continuum_ingress.admin import AdminAuth, AdminEndpoints
from continuum_ingress.asgi import Receive, Scope, Send
from continuum_ingress.cache.hook import CacheHook
from continuum_ingress.config_holder import ConfigHolder
from continuum_ingress.edge import EdgeGuard, EdgeLimits
from continuum_ingress.endpoints import ForwardEndpoint, InfoEndpoints
from continuum_ingress.errors import RequestError
from continuum_ingress.forwarding import Forwarder
from continuum_ingress.gemini.wiring import build_gemini
from continuum_ingress.hooks import BodyRewriter, Component, RequestScorer, ResponseCacheHook
from continuum_ingress.kv import EmbeddedIndexFactory, KvRouting, build_kv_routing, kv_admin_routes
from continuum_ingress.kv.answer_ids import AskForAnswerIds
from continuum_ingress.load_view import build_load_share
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.pipeline import SelectionPipeline
from continuum_ingress.policy.scorer import BackendScorer
from continuum_ingress.pool import BackendPool
from continuum_ingress.protocol.apis import CLIENT_PATHS, path_error_style
from continuum_ingress.protocol.dialects import UpstreamDialect, default_dialects
from continuum_ingress.protocol.errors import error_body
from continuum_ingress.response_affinity import ResponseAffinity
from continuum_ingress.rewriters import AnthropicCacheControl, SaltEcho
from continuum_ingress.snapshot import SnapshotFactory
from continuum_ingress.stored_responses import StoredResponses
from continuum_ingress.transport import TransportFactory
from continuum_ingress.workers import WorkerSeat

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL_S = 1.0


class IngressApp:
    def __init__(
        self,
        config: str | Path | RouterConfig,
        *,
        response_cache: ResponseCacheHook | None = None,
        scorer: BackendScorer | RequestScorer | None = None,
        rewriters: Sequence[BodyRewriter] = (),
        components: Sequence[Component] = (),
        dialects: Mapping[str, UpstreamDialect] | None = None,
        transport: TransportFactory | None = None,
        extra_admin_routes: Sequence[BaseRoute] = (),
        redis: SharedRedis | None = None,
        cache_monitor_interval_s: float = 30.0,
        nats_url: str | None = None,
        embedded_index: EmbeddedIndexFactory | None = None,
        worker: WorkerSeat | None = None,
        reload_interval: float = 1.0,
        health_tick: float = 0.1,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = BackendPool()
        self.clients = ClientSet() if transport is None else ClientSet(transport)
        self.metrics = IngressMetrics(self.pool)
        # Raises ConfigError (with every problem) on a bad file.
        initial = config if isinstance(config, RouterConfig) else load_router_config(config)
        # The process's one NATS connection (KV routing, load reports between replicas, the
        # Gemini context cache's client); started only when one of them uses it. `nats_url`
        # overrides bus.url (`up`'s embedded server).
        self.nats = NatsLink(initial.bus, url=nats_url)
        # Gemini: its dialect, the context cache rewriter/component, admin routes.
        self.gemini = build_gemini(initial, self.metrics.registry, link=self.nats)
        self.dialects = dict(dialects or {**default_dialects(), "gemini": self.gemini.dialect})
        factory = SnapshotFactory(self.pool, self.clients, self.dialects, rng)
        # Raises ConfigError on an unreadable secret.
        self.holder = ConfigHolder(config, factory.build, initial)
        self.holder.on_reload.append(self.metrics.reload)
        # One trace per request when `tracing.enabled` (request_trace.py; a restart-only section).
        self.tracing = Tracing(initial.tracing, "ingress")
        # The HTTP edge's limits apply to the server this app is mounted on (read at start;
        # a change to them takes a restart, like server.host and server.port).
        self.edge = EdgeGuard(EdgeLimits.from_config(initial.server), self.metrics.registry)
        # One Redis client per process (response cache; the KV scorer's Redis index).
        self.redis = redis or SharedRedis.from_config(self.holder.current.config)
        builtin_components: list[Component] = [self.redis]
        admin_routes: list[BaseRoute] = []
        self.response_cache = self._response_cache(
            response_cache, cache_monitor_interval_s, builtin_components, admin_routes
        )
        admin_routes.extend(extra_admin_routes)
        # Tier 4 (kv/): the KV scorer, its index and admin routes, when kv_cache_index.enabled
        # and no scorer was given.
        self.kv = None if scorer is not None else self._kv_routing(embedded_index, builtin_components, admin_routes)
        if self.kv is not None:
            scorer = self.kv.scorer
        # Stored Responses conversations stay with the backend that stored them; the ids learnt
        # travel with the load reports to the other processes.
        self.affinity = ResponseAffinity(initial.response_affinity, self.metrics.registry, clock)
        self.holder.on_config.append(self.affinity.reload)
        self.load_share = build_load_share(
            self.holder.current.config, self.pool, self.metrics.registry, kv=self.kv, seat=worker, link=self.nats,
            responses=self.affinity,
        )  # fmt: skip
        if self.load_share is not None:
            self.affinity.share()
        if self.load_share is not None:
            builtin_components.append(self.load_share)
        if self._uses_nats():  # first: started before its users, closed after them
            builtin_components.insert(0, self.nats)
        self.worker_metrics = None if worker is None else WorkerMetrics(worker, self.metrics.registry)
        if self.worker_metrics is not None:
            builtin_components.append(self.worker_metrics)
        self.components = (*builtin_components, *self.gemini.components, *components)
        for component in self.components:
            self.holder.on_config.append(component.reload)
        self.reload_interval = reload_interval
        self.pipeline = SelectionPipeline(
            self.pool, self.metrics, response_cache=self.response_cache, scorer=scorer, clock=clock,
            affinity=self.affinity,
        )  # fmt: skip
        self.forwarder = Forwarder(
            self.pipeline, self.metrics, self.dialects,
            [*self._builtin_rewriters(), *self.gemini.rewriters, *rewriters], clock, affinity=self.affinity,
        )  # fmt: skip
        self.health = HealthChecker(self.holder, self.pool, clock, tick=health_tick)
        self.ready = False
        self._ready_at = 0.0
        self.starlette = self._build_starlette([*self.gemini.admin_routes, *admin_routes])
        # The forwarding endpoints are dispatched before the framework's middleware stack (a
        # dict lookup instead of ~10 middleware layers per request); everything else - admin,
        # models, health, metrics, 404/405 bodies, lifespan - goes through Starlette.
        self.asgi = HotPaths(self.starlette, self._forward_endpoints)

    def is_ready(self) -> bool:
        """Serving (not starting, not draining), with the KV routing state replayed: the KV
        index fed and the route history applied, or `kv_cache_index.ready_timeout` passed."""
        if not self.ready:
            return False
        kv = self.kv
        if kv is None or kv.warm:
            return True
        return time.monotonic() - self._ready_at >= kv.section.ready_timeout

    def _response_cache(
        self,
        given: ResponseCacheHook | None,
        monitor_interval_s: float,
        components: list[Component],
        admin_routes: list[BaseRoute],
    ) -> ResponseCacheHook:
        """The response cache hook passed in, else the one the configuration describes (a
        component with admin routes of its own)."""
        if given is not None:
            return given
        cache = CacheHook.from_config(
            self.holder.current.config,
            registry=self.metrics.registry,
            redis=self.redis,
            monitor_interval_s=monitor_interval_s,
        )
        components.append(cache)
        admin_routes.extend(cache.admin_routes())
        return cache

    def _kv_routing(
        self, embedded_index: EmbeddedIndexFactory | None, components: list[Component], admin_routes: list[BaseRoute]
    ) -> KvRouting | None:
        kv = build_kv_routing(
            self.holder.current.config,
            self.metrics.registry,
            link=self.nats,
            redis=self.redis,
            embedded_index=embedded_index,
        )
        if kv is not None:
            components.append(kv)
            admin_routes.extend(kv_admin_routes(kv))
        return kv

    def _uses_nats(self) -> bool:
        """Whether anything in this process talks on NATS (then its connection is started)."""
        return (
            self.kv is not None
            or self.gemini.cache is not None
            or (self.load_share is not None and any(t.name == "nats" for t in self.load_share.transports))
        )

    def _builtin_rewriters(self) -> list[BodyRewriter]:
        builtin: list[BodyRewriter] = [AnthropicCacheControl(self.metrics)]
        if self.kv is not None:  # precise groups ask vLLM for their answers' token ids
            builtin.append(AskForAnswerIds())
        salt = self.holder.current.config.kv_cache_index.salt_echo
        if salt.enabled:
            # Read once at start: kv_cache_index is a restart-only section.
            secret = read_secret(salt.secret_env, salt.secret_file, what="kv_cache_index.salt_echo.secret")
            assert secret is not None  # the schema requires a source when enabled
            builtin.append(SaltEcho(secret.encode(), self.metrics))
        return builtin

    def _build_starlette(self, extra_admin_routes: Sequence[BaseRoute]) -> Starlette:
        app = Starlette(lifespan=self.lifespan)
        self._forward_endpoints: dict[str, ForwardEndpoint] = {}
        for path, api in CLIENT_PATHS.items():
            endpoint = ForwardEndpoint(
                api,
                holder=self.holder,
                pipeline=self.pipeline,
                forwarder=self.forwarder,
                metrics=self.metrics,
                tracing=self.tracing,
            )
            self._forward_endpoints[path] = endpoint
            app.router.routes.append(Route(path, endpoint, methods=["POST"]))
        exposition = None if self.worker_metrics is None else self.worker_metrics.exposition
        info = InfoEndpoints(self.holder, self.pool, self.metrics, self.is_ready, exposition)
        app.router.routes.append(Route("/v1/models", info.models, methods=["GET"]))
        app.router.routes.append(Route("/v1/models/{model:path}", info.model, methods=["GET"]))
        app.router.routes.append(Route("/healthz", info.healthz, methods=["GET"]))
        app.router.routes.append(Route("/readyz", info.readyz, methods=["GET"]))
        app.router.routes.append(Route("/metrics", info.prometheus, methods=["GET"]))
        stored = StoredResponses(self.holder, self.pool, self.affinity, self.dialects)
        app.router.routes.extend(stored.routes())
        admin = AdminEndpoints(self.holder, self.pool, self.metrics)
        admin_router = Router(routes=[*admin.routes(), *extra_admin_routes])
        app.router.routes.append(Mount("/admin", app=AdminAuth(admin_router, self.holder)))
        app.add_exception_handler(StarletteHTTPException, _http_error)
        return app

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: object) -> AsyncIterator[None]:
        """Start components, run the background loops in one TaskGroup, and on shutdown stop
        the loops, close the components (last started, first closed) and the backend clients."""
        stop = asyncio.Event()
        started: list[Component] = []
        try:
            for component in self.components:
                await component.start()
                started.append(component)
            async with asyncio.TaskGroup() as tasks:
                if self.holder.path is not None and self.reload_interval > 0:
                    tasks.create_task(self.holder.watch(stop, self.reload_interval))
                tasks.create_task(self.health.run(stop))
                tasks.create_task(self._maintenance(stop))
                tasks.create_task(measure_loop_lag(self.metrics.loop_lag, stop))
                self.ready = True
                self._ready_at = time.monotonic()
                log.info("ingress ready: %d backend(s)", len(self.holder.current.backends))
                try:
                    yield
                finally:
                    self.ready = False
                    stop.set()
        finally:
            for component in reversed(started):
                try:
                    await component.aclose()
                except Exception:
                    log.exception("a component failed to close")
            await self.clients.aclose()
            # Flushes the spans still queued (bounded by the exporter's 5 s timeout; at exit).
            self.tracing.shutdown()
            log.info("ingress stopped")

    async def _maintenance(self, stop: asyncio.Event) -> None:
        """Close HTTP clients that hot reloads retired once no request can use them."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), MAINTENANCE_INTERVAL_S)
            except TimeoutError:
                pass
            try:
                self.holder.retired_idle()
                await self.clients.close_unused(s.clients for s in self.holder.live_snapshots())
            except Exception:
                log.exception("maintenance round failed")

    def reload(self) -> bool:
        return self.holder.reload()


class HotPaths:
    """ASGI front: POSTs to a forwarding path go straight to their endpoint."""

    def __init__(self, app: Starlette, endpoints: Mapping[str, ForwardEndpoint]) -> None:
        self.app = app
        self.endpoints = dict(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    """404/405 and other routing errors in the provider shape of the path."""
    assert isinstance(exc, StarletteHTTPException)
    style = path_error_style(request.url.path)
    kind = {404: "not_found", 405: "method"}.get(exc.status_code, "invalid_request")
    message = {
        404: f"Unknown path {request.url.path}.",
        405: f"Method {request.method} is not allowed on {request.url.path}.",
    }.get(exc.status_code, str(exc.detail))
    error = RequestError(exc.status_code, message, kind=kind, code="unknown_url" if exc.status_code == 404 else None)
    return Response(
        error_body(style, error, ""), status_code=exc.status_code, media_type="application/json", headers=exc.headers
    )
