"""Requests about one stored Responses answer, sent to the backend that stored it
(docs/ingress.md, "Stored Responses conversations"):

    GET    /v1/responses/{id}               retrieve it (`?stream=true…` resumes a background stream)
    DELETE /v1/responses/{id}               delete it
    GET    /v1/responses/{id}/input_items   the conversation that led to it
    POST   /v1/responses/{id}/cancel        cancel a background response

Engines keep stored responses in their own process, so these requests go to the backend that
produced the id (response_affinity.py) or, when it is unknown here, to each backend that serves
the Responses API itself in turn while they answer 404 naming the id (at most
`response_affinity.max_probes`). The first other answer is relayed as it came (a stream
passed through as it arrives); none holding it is a 404 `response_not_found`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from continuum_ingress.asgi import RequestHeaders, read_headers
from continuum_ingress.config_holder import ConfigHolder
from continuum_ingress.errors import RequestError
from continuum_ingress.pool import BackendPool
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.dialects import AttemptDialect, UpstreamDialect
from continuum_ingress.protocol.errors import ErrorStyle, error_body
from continuum_ingress.protocol.response_ids import not_found_here
from continuum_ingress.relay import relay_headers
from continuum_ingress.response_affinity import ResponseAffinity
from continuum_ingress.snapshot import RouterSnapshot
from continuum_ingress.transport import UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

MAX_CANCEL_BODY = 64 * 1024  # a cancel carries no body; anything larger is refused


class StoredResponses:
    def __init__(
        self,
        holder: ConfigHolder,
        pool: BackendPool,
        affinity: ResponseAffinity,
        dialects: Mapping[str, UpstreamDialect],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.holder = holder
        self.pool = pool
        self.affinity = affinity
        self.dialects = dialects
        self.clock = clock

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses/{response_id}", self.handle, methods=["GET", "DELETE"]),
            Route("/v1/responses/{response_id}/input_items", self.handle, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", self.handle, methods=["POST"]),
        ]

    async def handle(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        info = read_headers(request.headers.raw)
        body = await _capped_body(request, MAX_CANCEL_BODY) if request.method == "POST" else b""
        if body is None:
            return _error(RequestError(413, "A cancel request carries no body.", kind="too_large"), info.request_id)
        snapshot = self.holder.acquire()
        try:
            for name in self._order(snapshot, response_id):
                answer = await self._ask(snapshot, name, request, body=body, response_id=response_id, info=info)
                if answer is not None:
                    return answer
        finally:
            self.holder.release(snapshot)
        error = RequestError(
            404,
            f"Response with id '{response_id}' was not found on any backend asked.",
            kind="not_found",
            code="response_not_found",
        )
        return _error(error, info.request_id)

    def _order(self, snapshot: RouterSnapshot, response_id: str) -> list[str]:
        """The backends to ask: the one that stored the id first when it is known, then every
        other healthy backend that serves the Responses API itself, at most `max_probes`."""
        settings = snapshot.config.response_affinity
        now = self.clock()
        routed = [n for names in snapshot.routes[Api.RESPONSES].values() for n in names]
        every = dict.fromkeys([*routed, *snapshot.wildcard[Api.RESPONSES]])  # configuration order, once
        names = [name for name in every if self._eligible(snapshot, name, now)]
        owner = self.affinity.owner(response_id) if settings.enabled else None
        if owner is not None and owner in names:
            self.affinity.count("owner")
            return [owner]  # it holds the response: another backend could only say 404
        self.affinity.count("unknown" if owner is None else "owner_unavailable")
        return names[: settings.max_probes] if settings.probe else names[:1]

    def _eligible(self, snapshot: RouterSnapshot, name: str, now: float) -> bool:
        state = self.pool.get(name)
        return self._native(snapshot, name) and state is not None and state.eligible(now)

    def _native(self, snapshot: RouterSnapshot, name: str) -> bool:
        """Serves the Responses API itself (not through a translating dialect, which stores nothing)."""
        dialect = self.dialects[snapshot.backends[name].type]
        return not isinstance(dialect, AttemptDialect) and dialect.translator(Api.RESPONSES, False) is None

    async def _ask(
        self,
        snapshot: RouterSnapshot,
        name: str,
        request: Request,
        *,
        body: bytes,
        response_id: str,
        info: RequestHeaders,
    ) -> Response | None:
        """The backend's answer to relay, or None when it does not hold the response (or could
        not be reached: the next is asked)."""
        spec, client = snapshot.backends[name], snapshot.clients[name]
        target = client.target(request.url.path)
        if request.url.query:
            target = f"{target}?{request.url.query}"
        headers = self.dialects[spec.type].headers(Api.RESPONSES, snapshot.api_keys.get(name), info.client)
        try:
            upstream = await client.transport.request(request.method, target, headers, body)
        except UpstreamError as exc:
            log.info("backend %s did not answer about a stored response: %s", name, type(exc).__name__)
            return None
        relayed = relay_headers(upstream.headers, name, info.request_id)
        if is_event_stream(upstream):
            return StreamingResponse(relay_stream(upstream), status_code=upstream.status, headers=_text(relayed))
        try:
            data = await upstream.read()
        except UpstreamError:
            return None
        finally:
            await upstream.aclose()
        if not_found_here(upstream.status, data, response_id):
            self.affinity.count("probed")
            return None
        if upstream.status < 300 and request.method != "DELETE":
            self.affinity.remember(response_id, name)
        return Response(data, status_code=upstream.status, headers=_text(relayed))


async def _capped_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it is longer than `limit` (read no further)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


def is_event_stream(upstream: UpstreamResponse) -> bool:
    return upstream.status < 300 and any(
        k == b"content-type" and v.startswith(b"text/event-stream") for k, v in upstream.headers
    )


async def relay_stream(upstream: UpstreamResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.stream():
            yield chunk
    except UpstreamError as exc:  # the client sees its stream end early
        log.info("a stored response's stream broke off: %s", type(exc).__name__)
    finally:
        await upstream.aclose()


def _text(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}


def _error(error: RequestError, request_id: str) -> Response:
    return Response(
        error_body(ErrorStyle.OPENAI, error, request_id),
        status_code=error.status,
        media_type="application/json",
        headers={"x-request-id": request_id},
    )
