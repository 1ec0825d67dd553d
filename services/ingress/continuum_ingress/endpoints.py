"""The client-facing HTTP endpoints.

The five forwarding endpoints are raw ASGI callables (no per-request framework objects on the
hot path): read headers and a bounded body, validate, route, forward. Everything that goes wrong
before the response starts becomes a provider-shaped error (OpenAI on /v1, Anthropic on
/anthropic) and is counted; nothing malformed reaches a backend.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from continuum_common.exposition import render
from continuum_common.tracing import Tracing
from continuum_ingress.asgi import (
    DISCONNECT_HOOK,
    RELAY,
    RESPOND,
    Channel,
    ClientGone,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    read_body,
    read_headers,
)
from continuum_ingress.cache.facade import CACHE_OFF, CacheLookup, CacheStatus
from continuum_ingress.cache.protocol.entry import CachedResponse
from continuum_ingress.config_holder import ConfigHolder
from continuum_ingress.errors import RequestError
from continuum_ingress.forwarding import Forwarder
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.pipeline import SelectionPipeline
from continuum_ingress.pool import BackendPool
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.errors import stream_error_event
from continuum_ingress.protocol.requests import parse_request
from continuum_ingress.relay import response_headers
from continuum_ingress.request_trace import RequestTrace
from continuum_ingress.snapshot import RouterSnapshot
from continuum_ingress.state import RequestState

log = logging.getLogger(__name__)


def _reject_reason(error: RequestError) -> str:
    if error.status == 413:
        return "too_large"
    if error.status == 404:
        return "unknown_model"
    if error.status == 503:
        return "no_backend"
    return "invalid_json" if error.code == "invalid_json" else "invalid_request"


def unknown_model(model: str, known: bool, api: Api) -> RequestError:
    if known:
        message = f"The model '{model}' is not served on this endpoint ({api.value}) by any configured backend."
    else:
        message = f"The model '{model}' does not exist or you do not have access to it."
    return RequestError(404, message, kind="not_found", param="model", code="model_not_found")


class ForwardEndpoint:
    """POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses,
    /anthropic/v1/messages."""

    def __init__(
        self,
        api: Api,
        *,
        holder: ConfigHolder,
        pipeline: SelectionPipeline,
        forwarder: Forwarder,
        metrics: IngressMetrics,
        clock: Callable[[], float] = time.perf_counter,
        tracing: Tracing | None = None,
    ) -> None:
        self.api = api
        self.holder = holder
        self.pipeline = pipeline
        self.forwarder = forwarder
        self.metrics = metrics
        self.clock = clock
        self.tracing = tracing if tracing is not None and tracing.enabled else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = self.clock()
        api = self.api
        info = read_headers(scope["headers"])
        channel = Channel(send, scope.get(RESPOND), scope.get(RELAY))
        snapshot = self.holder.acquire()
        rtrace = None if self.tracing is None else RequestTrace(self.tracing, api.value, scope["headers"])
        try:
            try:
                raw = await read_body(receive, info.content_length, snapshot.config.server.max_body_bytes)
                request = parse_request(api, raw)
                if not snapshot.route(api, request.model):
                    raise unknown_model(request.model, snapshot.knows_model(request.model), api)
            except RequestError as error:
                self.metrics.rejected(api.value, _reject_reason(error))
                await channel.error(api.error_style, error, info.request_id)
                return
            state = RequestState(
                info.request_id, request, raw, info.client, scope["headers"], info.session_id or request.user, started,
                read_at=self.clock(),
            )  # fmt: skip
            if rtrace is not None:
                state.trace = rtrace.describe(request.model, request.stream, info.request_id)
            with DisconnectWatch(receive, channel, scope.get(DISCONNECT_HOOK)) as watch:
                state.task = watch.task
                try:
                    await self._serve(state, snapshot, channel)
                except RequestError as error:
                    if channel.started:
                        # A stream's head went out before its first token, which never came
                        # from any backend tried: the error goes in-band, as a broken stream's.
                        await self._fail_stream(channel, api, error)
                        return
                    if error.status == 503:
                        self.metrics.rejected(api.value, "no_backend")
                    await channel.error(api.error_style, error, info.request_id)
                except asyncio.CancelledError:
                    if not watch.absorb():
                        raise
                    self.metrics.client_disconnects.inc()
                    channel.status = 499  # nginx's "client closed request", for our own metrics
        except ClientGone:
            channel.status = 499
        except Exception:
            # A bug, not bad input: log it, and answer 500 in the provider's shape if we still can.
            log.exception("unexpected error serving request %s", info.request_id)
            if channel.started:
                raise
            internal = RequestError(500, "Internal error in the router.", kind="internal", code="internal_error")
            await channel.error(api.error_style, internal, info.request_id)
        finally:
            self.holder.release(snapshot)
            if channel.status:
                self.metrics.request(api.value, channel.status, self.clock() - started)
            if rtrace is not None:
                rtrace.end(channel.status)

    async def _serve(self, state: RequestState, snapshot: RouterSnapshot, channel: Channel) -> None:
        # The response cache first: a HIT needs no prefix key and no backend. (Off and untraced:
        # no coroutine for it.)
        if state.trace is None and not self.pipeline.response_cache.enabled:
            lookup = CACHE_OFF
        else:
            lookup = await self._lookup(state)
        if lookup.response is not None:
            await self._replay(state, lookup.response, channel)
        else:
            self.pipeline.prepare(state, snapshot)
            await self.forwarder.forward(state, snapshot, channel, lookup)

    async def _lookup(self, state: RequestState) -> CacheLookup:
        if state.trace is None:
            return await self.pipeline.lookup_cache(state)
        with state.trace.span("cache.lookup") as span:
            lookup = await self.pipeline.lookup_cache(state)
            span.set_attribute("continuum.cache", "none" if lookup.status is CacheStatus.OFF else lookup.status.lower())
            return lookup

    @staticmethod
    async def _fail_stream(channel: Channel, api: Api, error: RequestError) -> None:
        if channel.finishing:  # the body already ended: nothing can be added
            return
        await channel.body(stream_error_event(api.error_style, error.message), more=True)
        await channel.body(b"")
        channel.status = error.status  # what happened, for the metrics; the client saw the head's

    @staticmethod
    async def _replay(state: RequestState, cached: CachedResponse, channel: Channel) -> None:
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cached.headers]
        headers = [(k, v) for k, v in headers if k not in (b"content-length", b"x-cache", b"transfer-encoding")]
        # X-Cache: HIT and the cache's own headers
        headers.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in state.cache_headers)
        headers.append((b"x-request-id", state.request_id.encode()))
        if not cached.is_stream:
            await channel.whole(cached.status, headers, cached.body)
            return
        # One chunk per SSE event; their concatenation is the original stream, byte for byte.
        await channel.start(cached.status, headers)
        for chunk in cached.events:
            await channel.body(chunk, more=True)
        await channel.body(b"")


# Re-exported for the response-cache integration (it builds headers the same way).
__all__ = ["ForwardEndpoint", "response_headers", "unknown_model"]


class InfoEndpoints:
    """GET /v1/models, /healthz, /readyz, /metrics (off the hot path; plain Starlette)."""

    def __init__(
        self,
        holder: ConfigHolder,
        pool: BackendPool,
        metrics: IngressMetrics,
        is_ready: Callable[[], bool],
        exposition: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        """`exposition`: what /metrics answers, when not this process's registry alone (a
        worker answers for every worker of its `serve`)."""
        self.holder = holder
        self.exposition = exposition
        self.pool = pool
        self.metrics = metrics
        self.is_ready = is_ready
        self.created = int(time.time())

    async def models(self, request: Request) -> Response:
        snapshot = self.holder.current
        data = [{"id": m, "object": "model", "created": self.created, "owned_by": "continuum"} for m in snapshot.models]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name not in self.holder.current.models:
            body = {
                "error": {
                    "message": f"The model '{name}' does not exist or you do not have access to it.",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            }
            return JSONResponse(body, status_code=404)
        return JSONResponse({"id": name, "object": "model", "created": self.created, "owned_by": "continuum"})

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(self, request: Request) -> Response:
        """Ready while serving (not starting, not draining). Backend health is reported, not
        required: a replica with no healthy backend answers 503s itself, and taking every
        replica out of a load balancer would not help anyone."""
        snapshot = self.holder.current
        healthy = [name for name in snapshot.backends if (s := self.pool.get(name)) is not None and s.healthy]
        body = {
            "ready": self.is_ready(),
            "generation": snapshot.generation,
            "backends": len(snapshot.backends),
            "healthy_backends": len(healthy),
        }
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    async def prometheus(self, request: Request) -> Response:
        if self.exposition is not None:
            return Response(await self.exposition(), media_type=CONTENT_TYPE_LATEST)
        return Response(await render(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)
