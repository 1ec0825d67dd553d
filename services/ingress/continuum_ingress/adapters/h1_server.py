"""The router's HTTP/1.1 server protocol: an ASGI 3 server for one connection, on httptools
(llhttp), with the edge limits (continuum_ingress.edge) built in.

Why not uvicorn's protocol: measured on the forwarding hot path
(`python -m continuum_bench.ingress_latency`, docs/benchmarks.md "The router's own HTTP
server"), replacing it took 4-19 % off the router's CPU per request at concurrency 64 and a
quarter off its added latency at concurrency 1. uvicorn's protocol builds a per-request
`asyncio.Event`, copies the body into a bytearray and out again, checks every response header
with regular expressions, writes head and body separately and arms and cancels three timers
per request. This protocol does the same HTTP/1.1 work with one future per wait, the
body handed over as received, one send per connection per turn of the loop (head and body of a
small response together), and no per-request timer:
the edge's timeouts are deadlines on the connection that one sweep per server checks
(`EdgeGuard.track`).

The request/response state the app's `receive` and `send` act on is adapters/h1_cycle.py.
uvicorn still runs the server around it (socket, lifespan, graceful shutdown: its `Server`
calls `shutdown()` on every connection and waits for the tasks in `server_state.tasks`); the
constructor takes uvicorn's protocol arguments.

What it does, and all it does:
* requests one at a time per connection; pipelined requests wait their turn (reading paused);
* request bodies as they arrive (Content-Length or chunked, de-chunked by llhttp), reading
  paused past 64 KiB not yet taken by the app; `Expect: 100-continue` answered on the app's
  first `receive()`;
* responses with Content-Length or chunked (when the app gives no length), `HEAD` without a
  body, `connection: close` when the client asked for it or the server is shutting down, the
  server's default headers (the date); writes wait for the socket to drain past the transport's
  high-water mark;
* `receive()` after the body, or after the client left, returns `http.disconnect` (at once once
  the client is gone; after the body it waits for the disconnect or the end of the response);
  the connection's `DisconnectHook` is in every scope (asgi.DisconnectWatch);
* an app error before the response started is answered 500 (an OpenAI-style error body), after
  it the connection is closed; no WebSocket (an `Upgrade` header is ignored).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import urllib.parse
from typing import Any

import httptools

from continuum_ingress.adapters.h1_cycle import STATUS_LINES, RequestCycle
from continuum_ingress.asgi import DISCONNECT_HOOK, RELAY, RESPOND, DisconnectHook
from continuum_ingress.edge import LINGER_S, EdgeGuard, edge_error

log = logging.getLogger(__name__)

HIGH_WATER = 65536  # request body bytes received and not yet taken before reading pauses
COALESCE_MAX = 16384  # what one turn writes, up to this size, is joined into one buffer; above, a list
ASGI_INFO = {"version": "3.0", "spec_version": "2.3"}
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
_INTERNAL = (
    b'{"error":{"message":"Internal error in the router.","type":"internal_error","param":null,'
    b'"code":"internal_error"}}'
)


class DefaultHeaders:
    """The server's default response headers (uvicorn's date header, refreshed every second by
    its main loop as a new list) encoded once per change, shared by every connection."""

    __slots__ = ("_encoded", "_source")

    def __init__(self) -> None:
        self._source: object = None
        self._encoded = b""

    def encoded(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not self._source:
            self._source = headers
            self._encoded = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
        return self._encoded


class H1ServerProtocol(asyncio.Protocol):
    """One client connection (see the module docstring). Built by uvicorn's server with its
    protocol arguments; `guard` and `defaults` are bound by `protocol_factory`."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        guard: EdgeGuard,
        defaults: DefaultHeaders,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.app_state = app_state
        self.guard = guard
        self.limits = guard.limits
        self._defaults = defaults
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.cycle: RequestCycle | None = None
        self._task: asyncio.Task[None] | None = None  # the app's task for `cycle`
        self.pipeline: collections.deque[RequestCycle] = collections.deque()
        self.hook = DisconnectHook(self.loop)
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._read_paused = False
        self._out: list[bytes] = []  # what this turn of the loop writes (one send at its end)
        self._flush_scheduled = False
        self._unread = 0  # body bytes received and not yet taken by the app
        # request head being parsed
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect = False
        # edge state (EdgeGuard.sweep reads the deadline)
        self._client_key: str | None = None
        self.refused = False
        self._reading_head = True
        self._head_bytes = 0
        self._parsed_head = 0
        self._in_body = False
        self.deadline = float("inf")
        self.deadline_kind = ""  # "head" | "idle" | "body" | "keepalive" | ""

    # -- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server_state.connections.add(self)
        server = transport.get_extra_info("sockname")
        client = transport.get_extra_info("peername")
        self.server = (server[0], server[1]) if isinstance(server, tuple) else None
        self.client = (client[0], client[1]) if isinstance(client, tuple) else None
        key = self.client[0] if self.client else ""
        if not self.guard.admit(key):
            limit = self.limits.max_connections_per_client
            self.refuse(429, f"Too many open connections from this client (limit {limit}).", "client_connections")
            return
        self._client_key = key
        self._set_deadline("idle", self.limits.header_timeout)
        self.guard.track(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self.guard.untrack(self)
        self.deadline_kind = ""
        self.hook.fire()
        if self._client_key is not None:
            self.guard.release(self._client_key)
            self._client_key = None
        cycle = self.cycle
        if cycle is not None:
            if not cycle.complete:
                cycle.disconnected = True
            cycle.wake()
        self.pipeline.clear()
        self.write_paused = False
        self._wake_drain()

    def eof_received(self) -> bool | None:
        return None  # as uvicorn's: the client's half-close closes the connection

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_drain()

    def _wake_drain(self) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self._drain is None:
            self._drain = self.loop.create_future()
        await self._drain

    def pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._read_paused and not self.pipeline:
            self._read_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
            if self._in_body:
                self._set_deadline("body", self.limits.body_timeout)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: an idle connection closes now, a busy one after its
        response."""
        cycle = self.cycle
        if cycle is None or cycle.complete:
            self.close()
        else:
            cycle.keep_alive = False

    # -- reading ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self._reading_head:
            self._head_bytes += len(data)
        elif self._in_body:
            self.deadline = self.loop.time() + self.limits.body_timeout
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol upgrades: the request was handled as plain HTTP
        except (httptools.HttpParserError, UnicodeDecodeError, ValueError):
            if not self.refused:
                self.refuse(400, "The request is not valid HTTP/1.1.", "invalid_http")
            return
        if self.refused or self.transport.is_closing():
            return
        if self._reading_head and self._head_bytes:
            if max(self._head_bytes, self._parsed_head) > self.limits.max_header_bytes:
                self._refuse_large_head()
            elif self.deadline_kind != "head":
                self._set_deadline("head", self.limits.header_timeout)

    def on_message_begin(self) -> None:
        self._reading_head = True
        self._url = b""
        self._headers = []
        self._expect = False
        self._parsed_head = 0

    def on_url(self, url: bytes) -> None:
        self._parsed_head += len(url)
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_head += len(name) + len(value) + 4
        name = name.lower()
        # llhttp keeps trailing whitespace, which is not part of a field value (RFC 9110 5.5)
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.refused:
            return  # after a refusal the rest of the read is parsed, nothing reaches the app
        if self._parsed_head > self.limits.max_header_bytes:
            self._refuse_large_head()
            return
        self._reading_head = False
        self._head_bytes = 0
        self._in_body = True
        self._set_deadline("body", self.limits.body_timeout)
        parser = self.parser
        version = parser.get_http_version()
        scope = self._scope(parser.get_method(), version)
        cycle = RequestCycle(self, scope, version != "1.0" and parser.should_keep_alive(), self._expect)
        scope[RESPOND] = cycle.respond
        scope[RELAY] = cycle
        current = self.cycle
        if current is None or current.complete:
            self._start(cycle)
        else:
            self.pipeline.append(cycle)  # answered in turn; nothing more is read until then
            self.pause_reading()

    def _scope(self, method: bytes, version: str) -> dict[str, Any]:
        url = self._url
        if url[:1] == b"/" and b"?" not in url and b"%" not in url:
            raw_path, query, path = url, b"", url.decode("ascii")
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
            path = urllib.parse.unquote(raw_path.decode("ascii"))
        return {
            "type": "http",
            "asgi": ASGI_INFO,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "root_path": "",
            "headers": self._headers,
            "state": self.app_state.copy(),
            "method": _METHODS.get(method) or method.decode("ascii"),
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            DISCONNECT_HOOK: self.hook,
        }

    def on_body(self, body: bytes) -> None:
        if self.refused:
            return
        cycle = self.pipeline[-1] if self.pipeline else self.cycle
        if cycle is None or cycle.complete:
            return  # answered before its body ended: the rest is read and dropped
        cycle.body.append(body)
        self._unread += len(body)
        if self._unread > HIGH_WATER:
            self.pause_reading()
            self.deadline_kind = ""  # our own pause: not the client's stall
        cycle.wake()

    def on_message_complete(self) -> None:
        if self.refused:
            return
        self._in_body = False
        self._reading_head = True
        self._head_bytes = 0
        if self.deadline_kind == "body":
            self.deadline_kind = ""
        cycle = self.pipeline[-1] if self.pipeline else self.cycle
        if cycle is None:
            return
        if not cycle.complete:
            cycle.more_body = False
            cycle.wake()
        elif not self.pipeline:  # answered before its body ended: idle from now on
            self._set_deadline("keepalive", self.limits.keepalive_timeout)

    def body_taken(self, size: int) -> None:
        self._unread = max(0, self._unread - size)

    # -- the app ---------------------------------------------------------------------------
    def _start(self, cycle: RequestCycle) -> None:
        self.cycle = cycle
        task = self._task = self.loop.create_task(self._run(cycle))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, cycle: RequestCycle) -> None:
        try:
            await self.app(cycle.scope, cycle.receive, cycle.send)
        except asyncio.CancelledError:
            if not cycle.complete:  # the server is stopping past its drain time
                self.close()
            raise
        except Exception as exc:
            log.error("exception in the ASGI application", exc_info=exc)
            if not cycle.started and not cycle.disconnected:
                self._internal_error(cycle)
            elif not cycle.complete:
                self.close()
        else:
            if not cycle.started and not cycle.disconnected:
                log.error("the ASGI application returned without starting a response")
                self._internal_error(cycle)
            elif not cycle.complete and not cycle.disconnected:
                log.error("the ASGI application returned without completing its response")
                self.close()

    def _internal_error(self, cycle: RequestCycle) -> None:
        cycle.started = cycle.complete = True
        cycle.keep_alive = False
        head = STATUS_LINES[500] + self.default_headers()
        head += b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(_INTERNAL)
        self.write(head + _INTERNAL)
        self.response_complete(cycle)

    def default_headers(self) -> bytes:
        return self._defaults.encoded(self.server_state.default_headers)

    # -- writing ---------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Queue `data` for the one send at the end of this turn of the loop (a response's
        head and a small body together; a stream's head without waiting for its first token)."""
        if not data or self.transport.is_closing():
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def close(self) -> None:
        """Close the connection after what this turn of the loop has written."""
        self.flush()
        self.transport.close()

    def flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        transport = self.transport
        if not out or transport.is_closing():
            return
        if len(out) == 1:
            transport.write(out[0])
        elif sum(len(b) for b in out) <= COALESCE_MAX:
            transport.write(b"".join(out))
        else:
            transport.writelines(out)

    def response_complete(self, cycle: RequestCycle) -> None:
        self.server_state.total_requests += 1
        transport = self.transport
        if not cycle.keep_alive:
            self.close()
        if transport.is_closing():
            return
        self._unread = 0
        if self.pipeline:
            nxt = self.pipeline.popleft()
            self._start(nxt)
            if not self.pipeline:
                self.resume_reading()
            return
        self.resume_reading()
        if self._reading_head and self._head_bytes:
            self._set_deadline("head", self.limits.header_timeout)
        elif not self._in_body:
            self._set_deadline("keepalive", self.limits.keepalive_timeout)

    # -- moving to a sibling worker (continuum_ingress.rebalancer) ---------------------------
    def idle(self) -> bool:
        """Between requests with nothing in flight either way, so the connection can move to
        another process without losing or reordering a byte: what the client sends next waits
        in the socket for whoever reads it."""
        task = self._task
        transport = self.transport
        return (
            self.deadline_kind in ("keepalive", "idle")
            and self._head_bytes == 0
            and not (self.refused or self._in_body or self.pipeline or self._out)
            and not (self._read_paused or self.write_paused)
            and (task is None or task.done())
            and not transport.is_closing()
            and transport.get_write_buffer_size() == 0
        )

    def socket_copy(self) -> int:
        """A duplicate descriptor of the connection's socket, for another process."""
        sock = self.transport.get_extra_info("socket")
        return os.dup(sock.fileno())

    def let_go(self) -> None:
        """Drop this process's hold on a connection another process took over. Closing one
        descriptor of a socket another process still holds neither sends a FIN nor discards
        what the client sent; the connection lives on over there."""
        self.transport.abort()

    # -- the edge --------------------------------------------------------------------------
    def _set_deadline(self, kind: str, timeout: float) -> None:
        self.deadline_kind = kind
        self.deadline = self.loop.time() + timeout

    def expired(self, now: float) -> None:
        """The sweep found the deadline passed (EdgeGuard.sweep)."""
        kind = self.deadline_kind
        if self.transport.is_closing() or self.refused:
            return
        cycle = self.cycle
        busy = cycle is not None and not cycle.complete
        if kind == "keepalive":
            if not busy:
                self.close()
        elif kind == "idle":
            self.guard.rejected("idle_timeout")
            self.close()
        elif kind == "head":
            if busy:  # a pipelined head behind a request still being answered: wait for it
                self._set_deadline("head", self.limits.header_timeout)
                return
            timeout = self.limits.header_timeout
            self.refuse(408, f"The request headers did not arrive within {timeout:g}s.", "header_timeout")
        elif kind == "body":
            self._body_stalled()
        self.deadline_kind = ""

    def _body_stalled(self) -> None:
        cycle = self.pipeline[-1] if self.pipeline else self.cycle
        if cycle is not None and cycle.started:
            self.guard.rejected("body_timeout")
            self.close()
            return
        if cycle is not None:
            cycle.disconnected = True  # the app's receive() sees a disconnect; its answer is dropped
            cycle.wake()
        timeout = self.limits.body_timeout
        self.refuse(408, f"The request body stalled for {timeout:g}s before its end.", "body_timeout")

    def _refuse_large_head(self) -> None:
        limit = self.limits.max_header_bytes
        self.refuse(431, f"The request headers exceed {limit} bytes.", "header_too_large")

    def refuse(self, status: int, message: str, reason: str) -> None:
        self.refused = True
        self.deadline_kind = ""
        self.guard.rejected(reason)
        log.info("edge: refused a connection from %s (%s)", self.client[0] if self.client else "?", reason)
        transport = self.transport
        if transport.is_closing():
            return
        self.flush()  # an answer written earlier in this turn goes first
        transport.write(edge_error(status, message, reason))
        # A lingering close: closing with unread bytes in the socket makes the kernel send a
        # reset, which can destroy the answer before the client reads it (a client still
        # sending a huge head). Send FIN, discard what still comes (data_received ignores it)
        # and close once the client does, or after LINGER_S at most.
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()


def protocol_factory(guard: EdgeGuard) -> Any:
    """What uvicorn's `Config(http=...)` takes: the protocol bound to one server's edge."""
    return functools.partial(H1ServerProtocol, guard=guard, defaults=DefaultHeaders())
