"""Raw ASGI helpers for the hot path: header extraction, bounded body reading, a response
channel that remembers what was sent, and a disconnect watch that cancels the request's task
when the client goes away (uvicorn silently drops sends after a disconnect, so without it an
upstream generation would run on for nobody)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from continuum_ingress.errors import RequestError
from continuum_ingress.protocol.client_headers import ClientHeaders
from continuum_ingress.protocol.errors import ErrorStyle, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PASSTHROUGH = {b"traceparent": "traceparent", b"tracestate": "tracestate", b"x-request-id": "x-request-id"}
_MAX_ID = 128
# Every header read_headers looks at; the others (host, content-type, user-agent, ...) are
# skipped with one set lookup.
_READ = frozenset(
    {b"authorization", b"x-api-key", b"content-length", b"anthropic-version", b"anthropic-beta", b"x-session-id"}
) | frozenset(_PASSTHROUGH)

# A key of an `http.response.body` message that the ingress's own HTTP server reads (other ASGI
# servers ignore it): write what the response has queued now, not at the end of the loop's turn.
FLUSH = "continuum.flush"


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


# Not frozen (built per request; a frozen dataclass costs 4x to build). Treat as immutable.
@dataclass(slots=True)
class RequestHeaders:
    client: ClientHeaders
    session_id: str | None
    content_length: int | None
    request_id: str


def _clean_id(value: str) -> str | None:
    return value if 0 < len(value) <= _MAX_ID and value.isprintable() else None


def read_headers(headers: Sequence[tuple[bytes, bytes]]) -> RequestHeaders:
    bearer = x_api_key = version = beta = session = request_id = None
    length: int | None = None
    passthrough: list[tuple[str, str]] = []
    for name, value in headers:
        if name not in _READ:
            continue
        if name == b"authorization":
            text = value.decode("latin-1")
            if text[:7].lower() == "bearer ":
                bearer = text[7:].strip() or None
        elif name == b"x-api-key":
            x_api_key = value.decode("latin-1") or None
        elif name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = None
        elif name == b"anthropic-version":
            version = value.decode("latin-1")
        elif name == b"anthropic-beta":
            beta = value.decode("latin-1")
        elif name == b"x-session-id":
            session = _clean_id(value.decode("latin-1"))
        elif name in _PASSTHROUGH:
            text = value.decode("latin-1")
            passthrough.append((_PASSTHROUGH[name], text))
            if name == b"x-request-id":
                request_id = _clean_id(text)
    client = ClientHeaders(bearer, x_api_key, version, beta, tuple(passthrough))
    # A fresh id needs to be unique, not secret: the process's Mersenne Twister (seeded from the
    # OS, reseeded in a forked child) instead of os.urandom, a system call per request.
    return RequestHeaders(client, session, length, request_id or f"{random.getrandbits(96):024x}")


def too_large(limit: int) -> RequestError:
    return RequestError(
        413, f"Request body is larger than the limit of {limit} bytes.", kind="too_large", code="request_too_large"
    )


async def read_body(receive: Receive, content_length: int | None, limit: int) -> bytes:
    """The whole request body, refusing (413) as soon as it is known to exceed `limit`."""
    if content_length is not None and content_length > limit:
        raise too_large(limit)
    first = await receive()
    if first["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = first.get("body", b"")
    if not first.get("more_body", False):
        if len(body) > limit:
            raise too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


class Channel:
    """The response side of one request: records whether the response started and its status,
    and marks the final body message so the disconnect watch ignores the end of the request."""

    __slots__ = ("_respond", "_send", "finishing", "relay", "started", "status")

    def __init__(self, send: Send, respond: Respond | None = None, relay: Relay | None = None) -> None:
        self._send = send
        self._respond = respond
        self.relay = relay  # the router's own server: chunks written from callbacks
        self.started = False
        self.finishing = False
        self.status = 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool = False, *, flush: bool = False) -> None:
        """`flush`: on the ingress's own server, written at once rather than at the end of the
        loop's turn (a relayed stream's chunk, which nothing else in the turn joins)."""
        if not more:
            self.finishing = True
        message = {"type": "http.response.body", "body": data, "more_body": more}
        if flush:
            message[FLUSH] = True
        await self._send(message)

    async def whole(self, status: int, headers: list[tuple[bytes, bytes]], data: bytes) -> None:
        headers.append((b"content-length", str(len(data)).encode()))
        respond = self._respond
        if respond is not None and respond(status, headers, data):
            self.started = self.finishing = True
            self.status = status
            return
        await self.start(status, headers)
        await self.body(data)

    async def error(self, style: ErrorStyle, error: RequestError, request_id: str) -> None:
        headers = [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode())]
        if style is ErrorStyle.ANTHROPIC:
            headers.append((b"request-id", request_id.encode()))
        await self.whole(error.status, headers, error_body(style, error, request_id))


async def send_json(send: Send, status: int, payload: object, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = orjson.dumps(payload)
    out = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": data, "more_body": False})


RESPOND = "continuum.respond"
"""Scope key under which the router's HTTP protocol puts a `Respond` for the request: a whole
response in one synchronous call instead of two ASGI messages (a `Channel` uses it when given)."""


class Respond(Protocol):
    """Sends a whole response (status, headers with its Content-Length, body) at once; returns
    False, with nothing sent, when it cannot (the caller then uses the ASGI `send`)."""

    def __call__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, /) -> bool: ...


RELAY = "continuum.relay"
"""Scope key under which the router's HTTP protocol puts a `Relay` for the request: a started
streamed response's chunks written synchronously, from the upstream connection's callbacks."""


class Relay(Protocol):
    def relay_ready(self) -> bool:
        """Whether `relay` may write now (the response started, the client is reading)."""
        ...

    def relay(self, data: bytes) -> None:
        """Write one body chunk now, more to follow."""
        ...


DISCONNECT_HOOK = "continuum.disconnect"
"""Scope key under which the router's HTTP protocol (adapters/h1_server.py) puts the connection's
`DisconnectHook`."""


class DisconnectHook:
    """One per client connection, set by the router's HTTP protocol in every request's scope: the
    protocol calls `fire()` when the connection is lost, which calls the callback the request
    being served registered (requests on one connection are served one at a time). It also
    carries the connection's loop: `asyncio.current_task()` without one asks
    `get_running_loop()`, which costs a getpid() system call on every request."""

    __slots__ = ("callback", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.callback: Callable[[], None] | None = None
        self.loop = loop

    def fire(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class DisconnectWatch:
    """Cancels the current task when the client disconnects before the response is finished.

    Use as a context manager around the upstream work; `disconnected` tells the caller that a
    CancelledError was ours (then the task is un-cancelled and the request ends quietly).

    Under the router's HTTP protocol the connection's `DisconnectHook` (in the scope) tells it
    directly; under any other server a watcher task waits for `http.disconnect` on `receive`
    (a task per request costs about a tenth of the router's time on the hot path)."""

    __slots__ = ("_channel", "_hook", "_receive", "_target", "_watcher", "disconnected")

    def __init__(self, receive: Receive, channel: Channel, hook: DisconnectHook | None = None) -> None:
        self._receive = receive
        self._channel = channel
        self._hook = hook
        self._target: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected = False

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._on_disconnect()
                return

    def _on_disconnect(self) -> None:
        if not self._channel.finishing and self._target is not None:
            self.disconnected = True
            self._target.cancel()

    def __enter__(self) -> DisconnectWatch:
        if self._hook is not None:
            self._target = asyncio.current_task(self._hook.loop)
            self._hook.callback = self._on_disconnect
        else:
            self._target = asyncio.current_task()
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hook is not None:
            self._hook.callback = None
        elif self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The task the watch cancels (the one that entered it)."""
        return self._target

    def absorb(self) -> bool:
        """Call from `except CancelledError`: True (and un-cancel) when the client caused it."""
        if not self.disconnected:
            return False
        task = self._target
        if task is not None:
            with contextlib.suppress(AttributeError):
                task.uncancel()
        return True
