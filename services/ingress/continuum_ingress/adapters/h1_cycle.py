"""One HTTP/1.1 request and its response as the ASGI app sees them: `receive()` hands over the
request body as the connection received it, `send()` frames the response (Content-Length or
chunked). The connection (adapters/h1_server.H1ServerProtocol) feeds the body in and writes
out: what one turn of the loop writes leaves in one send, so a small response's head and body
go together."""

from __future__ import annotations

import asyncio
import http
import logging
from typing import Any, Protocol

from continuum_ingress.asgi import FLUSH

log = logging.getLogger(__name__)

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Connection(Protocol):
    """What a cycle uses of its connection (adapters/h1_server.H1ServerProtocol)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    write_paused: bool

    async def drain(self) -> None: ...
    def resume_reading(self) -> None: ...
    def body_taken(self, size: int) -> None: ...
    def default_headers(self) -> bytes: ...
    def write(self, data: bytes) -> None: ...
    def flush(self) -> None: ...
    def response_complete(self, cycle: RequestCycle) -> None: ...


def status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINES = {status: status_line(status) for status in range(100, 600)}


class RequestCycle:
    """One request and its response on a connection: what the app's `receive` and `send` act on
    (see adapters/h1_server.py for what the server does around it)."""

    __slots__ = (
        "body",
        "chunked",
        "complete",
        "conn",
        "delivered",
        "disconnected",
        "expect_continue",
        "is_head",
        "keep_alive",
        "more_body",
        "remaining",
        "scope",
        "started",
        "waiter",
    )

    def __init__(self, conn: Connection, scope: dict[str, Any], keep_alive: bool, expect: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_continue = expect
        self.is_head = scope["method"] == "HEAD"
        self.body: list[bytes] = []  # received, not yet taken by receive()
        self.more_body = True  # the request body has not ended
        self.delivered = False  # receive() returned the end of the body
        self.disconnected = False
        self.started = False
        self.complete = False
        self.chunked = False
        self.remaining: int | None = None  # Content-Length still to send
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = self.waiter = self.conn.loop.create_future()
        await waiter

    # -- ASGI receive ----------------------------------------------------------------------
    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        if self.expect_continue:
            self.expect_continue = False
            if self.more_body and not self.started and not conn.transport.is_closing():
                conn.transport.write(_CONTINUE)
        if not self.delivered:
            while not self.body and self.more_body and not self.disconnected and not self.complete:
                conn.resume_reading()
                await self._wait()
            if not (self.disconnected or self.complete):
                return self._take()
        # After the whole body: the next message is the end of the connection or the response.
        while not self.disconnected and not self.complete:
            await self._wait()
        return {"type": "http.disconnect"}

    def _take(self) -> dict[str, Any]:
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        self.body = []
        self.conn.body_taken(len(data))
        self.delivered = not self.more_body
        return {"type": "http.request", "body": data, "more_body": self.more_body}

    # -- ASGI send -------------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> None:
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return  # the client left: what the app still sends goes nowhere
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self._start(message["status"], message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
        self._body(message.get("body", b""), message.get("more_body", False))
        if message.get(FLUSH):  # a relayed stream chunk: written now, not at the end of the turn
            conn.flush()

    def respond(self, status: int, headers: Any, body: bytes) -> bool:
        """A whole response (its headers carry the Content-Length) in one call, as the two ASGI
        messages would send it, without their coroutines. False, with nothing done, while the
        connection's writes are paused or a response already started: then `send` it."""
        if self.started or (self.conn.write_paused and not self.disconnected):
            return False
        if not self.disconnected:
            self._start(status, headers)
            self._body(body, False)
        return True

    # -- a relayed stream's chunks, from the upstream connection's callbacks (asgi.Relay) ----
    def relay_ready(self) -> bool:
        """Whether `relay` may write now: the response has started, is not complete, and the
        client is there and reading."""
        return self.started and not self.complete and not self.disconnected and not self.conn.write_paused

    def relay(self, data: bytes) -> None:
        """A body chunk of a started response, more to follow, written at once."""
        self._body(data, True)
        self.conn.flush()

    def _start(self, status: int, headers: Any) -> None:
        self.conn.write(self._head(status, headers))
        self.started = True
        self.expect_continue = False

    def _body(self, body: bytes, more: bool) -> None:
        if self.complete:
            raise RuntimeError("ASGI message 'http.response.body' sent after the response completed")
        conn = self.conn
        if self.is_head:
            body = b""
        elif self.chunked:
            body = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                body += b"0\r\n\r\n"
        elif self.remaining is not None:
            self.remaining -= len(body)
            if self.remaining < 0:
                raise RuntimeError("response body longer than its Content-Length")
        conn.write(body)
        if not more:
            self.complete = True
            if self.remaining:
                log.error("response body shorter than its Content-Length; closing the connection")
                self.keep_alive = False
            conn.response_complete(self)

    def _head(self, status: int, headers: Any) -> bytes:
        lines = []
        close_sent = False
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                self.remaining = int(value)
            elif lower == b"transfer-encoding":
                self.chunked = value.lower() == b"chunked"
            elif lower == b"connection" and b"close" in value.lower():
                self.keep_alive = False
                close_sent = True
            lines.append(b"%s: %s\r\n" % (name, value))
        block = b"".join(lines)
        # A CR or LF inside a name or value would split the head (header injection): each
        # line must end in the only CRLF it holds.
        if block.count(b"\n") != len(lines) or block.count(b"\r") != len(lines):
            raise RuntimeError("invalid character in a response header")
        extra = b""
        if not self.keep_alive and not close_sent:
            extra = b"connection: close\r\n"
        if self.is_head or status in (204, 304):
            self.chunked = False
            self.remaining = None
        elif self.remaining is None and not self.chunked:
            self.chunked = True
            extra += b"transfer-encoding: chunked\r\n"
        first = STATUS_LINES.get(status) or status_line(status)
        return b"%s%s%s%s\r\n" % (first, self.conn.default_headers(), block, extra)
