"""The HTTP edge: the limits and timeouts a public gateway needs that uvicorn's httptools
protocol does not enforce itself.

* **Header size.** httptools buffers a header line until it is complete and has no size limit,
  so a client can make the router hold any amount of memory before a request exists. The bytes
  received while a request head is incomplete are counted per read (bounded by one socket read
  past the limit) and the head of a complete request by its parsed size; over
  `max_header_bytes` the client gets 431 and the connection is closed.
* **Header-read timeout.** From the connection's start, or from the first byte of a new request
  on a kept-alive connection, the head must be complete within `header_timeout` (slow-loris);
  a connection that never sends a byte is closed after the same time.
* **Body-read timeout.** While a request body is being received, `body_timeout` without a byte
  ends it with 408 (a body shorter than its Content-Length no longer holds the client and an
  ASGI task for ever). Time during which the router itself paused reading (the app had not
  consumed the body yet) does not count.
* **Idle keep-alive timeout** is uvicorn's own (`timeout_keep_alive`), set from the config.
* **Per-client connection cap.** At most `max_connections_per_client` open connections per
  client address; one more is answered 429 and closed. Behind a load balancer every connection
  comes from the balancer's address, so the cap must exceed what the balancer opens (0: no cap).

Every refusal is counted in `continuum_ingress_edge_rejections_total{reason}` and answered with
an OpenAI-style error body. The `EdgeGuard` is shared by every connection of one server (it
holds the per-client counts); `EdgeGuard.protocol` is what uvicorn's `http=` takes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from continuum_common.config.router import Server
from continuum_ingress.asgi import DISCONNECT_HOOK, DisconnectHook

log = logging.getLogger(__name__)

EDGE_REASONS = (
    "header_too_large",
    "header_timeout",
    "idle_timeout",
    "body_timeout",
    "client_connections",
    "invalid_http",
)
LINGER_S = 2.0  # how long a refused connection is drained before it is closed
_STATUS_TEXT = {
    400: b"Bad Request",
    408: b"Request Timeout",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
}


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 30.0
    max_connections_per_client: int = 1024  # 0: no cap

    @classmethod
    def from_config(cls, server: Server) -> EdgeLimits:
        return cls(
            max_header_bytes=server.max_header_bytes,
            header_timeout=server.header_timeout,
            body_timeout=server.body_timeout,
            keepalive_timeout=server.keepalive_timeout,
            max_connections_per_client=server.max_connections_per_client,
        )


def edge_error(status: int, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI-style error body that closes the connection."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
    return head % (status, _STATUS_TEXT[status], len(body)) + body


class EdgeGuard:
    """The limits, the per-client connection counts and the rejection counters of one server."""

    def __init__(self, limits: EdgeLimits, registry: CollectorRegistry | None = None) -> None:
        self.limits = limits
        self._per_client: dict[str, int] = {}
        self.open_connections = 0
        rejections = Counter(
            "continuum_ingress_edge_rejections",
            "Connections or requests refused at the HTTP edge (size limits, timeouts, connection cap)",
            ["reason"],
            registry=registry,
        )
        self._rejections = {reason: rejections.labels(reason) for reason in EDGE_REASONS}
        Gauge(
            "continuum_ingress_open_connections", "Client connections open on this process", registry=registry
        ).set_function(lambda: self.open_connections)

    @property
    def protocol(self) -> Any:
        """The protocol factory for uvicorn's `Config(http=...)`."""
        return functools.partial(EdgeProtocol, guard=self)

    def admit(self, client: str) -> bool:
        cap = self.limits.max_connections_per_client
        count = self._per_client.get(client, 0)
        if cap and count >= cap:
            return False
        self._per_client[client] = count + 1
        self.open_connections += 1
        return True

    def release(self, client: str) -> None:
        count = self._per_client.get(client, 0) - 1
        if count > 0:
            self._per_client[client] = count
        else:
            self._per_client.pop(client, None)
        self.open_connections -= 1

    def connections_of(self, client: str) -> int:
        return self._per_client.get(client, 0)

    def rejected(self, reason: str) -> None:
        self._rejections[reason].inc()


class CoalescingTransport:
    """The client connection's transport as uvicorn's protocol sees it: the writes made in one
    turn of the event loop reach the socket as one send. uvicorn writes a response's head and
    its body separately, which for every small JSON answer costs a second system call and a
    second TCP segment (and a second wake-up of the client). Closing, EOF and abort flush or
    drop what is pending first; everything else is the real transport's."""

    __slots__ = ("_loop", "_pending", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._pending.append(bytes(data))  # a copy: the caller may reuse a bytearray
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(d) for d in self._pending)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the edge limits (see the module docstring)."""

    def __init__(self, *args: Any, guard: EdgeGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard
        self._limits = guard.limits
        self.timeout_keep_alive = guard.limits.keepalive_timeout  # type: ignore[assignment]  # call_later takes a float
        self._client_key: str | None = None  # set once admitted (released on connection_lost)
        self._refused = False
        self._reading_head = True  # between requests or inside a request head
        self._head_bytes = 0  # raw bytes received while the head was incomplete
        self._parsed_head = 0  # url + header bytes of the current request as parsed
        self._in_body = False
        self._body_seen = 0.0  # loop time of the last body byte
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._disconnect = DisconnectHook(self.loop)  # in every request's scope (asgi.DisconnectWatch)

    # -- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        client = self.client[0] if self.client else ""
        if not self._guard.admit(client):
            limit = self._limits.max_connections_per_client
            self._refuse(429, f"Too many open connections from this client (limit {limit}).", "client_connections")
            return
        self._client_key = client
        self._head_timer = self.loop.call_later(self._limits.header_timeout, self._on_head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._disconnect.fire()
        if self._client_key is not None:
            self._guard.release(self._client_key)
            self._client_key = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._reading_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._reading_head:
            if max(self._head_bytes, self._parsed_head) > self._limits.max_header_bytes:
                self._refuse_large_head()
            elif self._head_bytes and self._head_timer is None:
                self._head_timer = self.loop.call_later(self._limits.header_timeout, self._on_head_timeout)
        elif self._in_body:
            self._body_seen = self.loop.time()
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self._limits.body_timeout, self._on_body_timeout)

    def send_400_response(self, msg: str) -> None:
        """Bytes that are not HTTP/1.1: uvicorn's plain-text 400 becomes an error body like
        every other refusal (and is counted)."""
        if not self._refused:
            self._refuse(400, "The request is not valid HTTP/1.1.", "invalid_http")

    # -- parser callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        self._parsed_head = 0

    def on_url(self, url: bytes) -> None:
        self._parsed_head += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_head += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        # After a refusal the rest of the read is parsed but nothing reaches the app.
        if self._refused:
            return
        if self._parsed_head > self._limits.max_header_bytes:
            self._refuse_large_head()
            return
        self._reading_head = False
        self._head_bytes = 0
        self._in_body = True
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()
        self.scope[DISCONNECT_HOOK] = self._disconnect  # type: ignore[literal-required]  # our extension key

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._in_body = False
        self._reading_head = True
        self._head_bytes = 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # -- timers ----------------------------------------------------------------------------
    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _on_head_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._reading_head:
            return
        if self._busy():
            # A pipelined head behind a request still being answered: wait for that answer.
            self._head_timer = self.loop.call_later(self._limits.header_timeout, self._on_head_timeout)
            return
        if self._head_bytes == 0:
            self._guard.rejected("idle_timeout")
            self.transport.close()
            return
        timeout = self._limits.header_timeout
        self._refuse(408, f"The request headers did not arrive within {timeout:g}s.", "header_timeout")

    def _on_body_timeout(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or not self._in_body:
            return
        idle = self.loop.time() - self._body_seen
        if self.flow.read_paused or idle < self._limits.body_timeout:
            # Reading is paused by the router itself (the app has not taken the body yet), or a
            # byte came since the timer was set: not the client's stall.
            wait = self._limits.body_timeout - (0.0 if self.flow.read_paused else idle)
            self._body_timer = self.loop.call_later(max(wait, 0.01), self._on_body_timeout)
            return
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self._guard.rejected("body_timeout")
            self.transport.close()
            return
        if cycle is not None:
            # The app's receive() sees a disconnect; its answer, if any, is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        timeout = self._limits.body_timeout
        self._refuse(408, f"The request body stalled for {timeout:g}s before its end.", "body_timeout")

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    # -- refusals --------------------------------------------------------------------------
    def _refuse_large_head(self) -> None:
        limit = self._limits.max_header_bytes
        self._refuse(431, f"The request headers exceed {limit} bytes.", "header_too_large")

    def _refuse(self, status: int, message: str, reason: str) -> None:
        self._refused = True
        self._cancel_timers()
        self._guard.rejected(reason)
        log.info("edge: refused a connection from %s (%s)", self.client[0] if self.client else "?", reason)
        if self.transport.is_closing():
            return
        self.transport.write(edge_error(status, message, reason))
        # A lingering close: closing with unread bytes in the socket makes the kernel send a
        # reset, which can destroy the answer before the client reads it (a client still
        # sending a huge head). Send FIN, discard what still comes (data_received ignores it)
        # and close once the client does, or after LINGER_S at most.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
