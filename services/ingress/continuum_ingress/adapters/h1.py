"""A lean pooled HTTP/1.1 client for the forwarding hot path (asyncio protocol + httptools): the
production `Transport` (transport.py).

Why not httpx here: profiling the ingress at concurrency 64 (docs/ingress.md, "Upstream HTTP
client") showed 60-80 % of its CPU inside httpcore's pool, which on every request walks every
pooled connection and polls each idle socket (`has_expired` -> `is_socket_readable`). This pool
is O(1) per request: idle connections sit on a LIFO stack and a connection the server closed is
dropped when its `connection_lost` arrives. Parsing is llhttp (httptools, already a uvicorn
dependency). The health checks use the same pools.

What it does, and all it does:
* `POST`/`GET` with a complete body, one request per connection at a time, keep-alive reuse;
* connect timeout, pool-wait timeout (= connect timeout), read timeout per wait for bytes;
* response bodies as they arrive (Content-Length, chunked - de-chunked by llhttp - or until
  close), with flow control: past 1 MiB buffered the socket stops being read;
* or handed to a sink from the connection's own callbacks (`Response.pump`): a relayed
  stream's chunks go out without a coroutine waking for each;
* closing a response before its end closes the connection (the server sees the disconnect:
  vLLM aborts the generation);
* a request that fails on a *reused* connection before any response byte arrived (the server
  closed it while idle) is sent once more on a fresh connection, as browsers do.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import httptools

from continuum_ingress.transport import ConnectFailed, Disconnected, ReadTimeout, UpstreamError

HIGH_WATER = 1 << 20  # buffered response bytes before the socket is paused
LOW_WATER = 1 << 18


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_chunks",
        "_paused",
        "_waiter",
        "buffered",
        "closed",
        "complete",
        "error",
        "got_bytes",
        "headers",
        "headers_done",
        "keep_alive",
        "last_rx",
        "last_used",
        "loop",
        "parser",
        "sink",
        "sink_error",
        "sink_once",
        "status",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.last_used = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self.got_bytes = False
        # While a Response pumps: where body chunks go as they are parsed (see Response.pump)
        self.sink: Callable[[bytes], bool] | None = None
        self.sink_error: Exception | None = None
        self.sink_once = False  # detach the sink after the first chunk it takes
        self.last_rx = 0.0

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        pumping = self.sink is not None
        if pumping:
            self.last_rx = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Disconnected(f"invalid HTTP response: {exc}"))
            self.close()
            return
        if pumping and self._chunks:
            self._to_sink()
        # A pump's task wakes only for what the sink cannot take: the end, or a refusal
        if not pumping or self.sink is None or self.complete:
            self._wake()

    def eof_received(self) -> bool | None:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.complete and exc is None and not self._has_length():
            self.complete = True  # a body delimited by the end of the connection
        elif not self.complete:
            self._fail(Disconnected("the server closed the connection" + (f" ({exc})" if exc else "")))
        self._wake()

    def pause_writing(self) -> None:  # request bodies are written at once; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()

    def _to_sink(self) -> None:
        """What one read brought, in one piece, to the pump's sink: one write to the client
        for a read's worth of chunks, as the task's `take()` joins them."""
        sink = self.sink
        assert sink is not None
        data = self.take()
        try:
            taken = sink(data)
        except Exception as exc:  # raised in the pumping task, not here
            self.sink_error = exc
            self.sink = None
            return
        if not taken:  # kept, with what follows, for the task to go on with
            self.untake(data)
            self.sink = None
        elif self.sink_once:
            self.sink = None

    # -- helpers ----------------------------------------------------------------------------
    def _has_length(self) -> bool:
        return any(k in (b"content-length", b"transfer-encoding") for k, _ in self.headers)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, limit: float) -> None:
        """Until something happens on the connection (bytes, end, error) or `limit` seconds.
        (A timer and a future, cheaper than asyncio.timeout on this path.)"""
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(limit, self._on_timeout, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _on_timeout(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            self._fail(ReadTimeout("no answer from the server within the read timeout"))
            waiter.set_result(None)

    def take(self) -> bytes:
        data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks.popleft()
        self._chunks.clear()
        self.buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def untake(self, data: bytes) -> None:
        """Put back what `take()` gave and a sink refused: first in line again."""
        self._chunks.appendleft(data)
        self.buffered += len(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def usable(self, now: float, expiry: float) -> bool:
        return (
            not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
            and now - self.last_used < expiry
        )


class Outbox:
    """Requests written at the end of the loop turn that sent them, one after the other.

    Why: a request written at once wakes the backend, which answers and goes back to sleep
    while the router is still working through the rest of the turn (the next client requests),
    so at concurrency 64 every request paid a wake-up of the backend inside its send, the
    largest single item of the router's CPU per request. Written together at the end of the
    turn, the first send wakes the backend and the rest find it awake. At concurrency 1 the
    cost is one pass of the loop (the turn has nothing else to do). Measured in
    docs/benchmarks.md ("Upstream requests written once per loop turn"). Bounded without a
    limit of its own: a connection carries one request at a time, so the queue never holds more
    entries than the pools sharing it have connections open."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: list[tuple[_Connection, bytes]] = []

    def post(self, conn: _Connection, data: bytes) -> None:
        queue = self._queue
        queue.append((conn, data))
        if len(queue) == 1:
            conn.loop.call_soon(self.flush)

    def flush(self) -> None:
        queue, self._queue = self._queue, []
        for conn, data in queue:
            transport = conn.transport
            # Closed meanwhile (the request was cancelled, or the server hung up): its
            # connection_lost reaches the waiting request, which fails or retries as it would have.
            if transport is None or transport.is_closing():
                continue
            try:
                transport.write(data)
            except Exception as exc:  # one connection's failure must not hold back the others
                conn._fail(Disconnected(f"{type(exc).__name__}: {exc}"))
                conn._wake()


class Response:
    """One upstream response. Iterate `stream()` or call `read()` (a stream may `pump()` part
    of its body first), then always `aclose()`."""

    __slots__ = ("_conn", "_done", "_idle_timer", "_pool", "headers", "read_timeout", "status")

    def __init__(self, pool: H1Pool, conn: _Connection, timeout: float) -> None:
        self._pool = pool
        self._conn = conn
        # Seconds each wait for bytes may take; may be changed while streaming (the forwarder
        # lowers it to the stream-idle timeout once the first chunk arrived).
        self.read_timeout = timeout
        self._done = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self.status = conn.status
        self.headers = conn.headers

    async def _next_chunk(self) -> bytes | None:
        """The next piece of the body as it arrives; None at its end."""
        conn = self._conn
        while True:
            if conn.buffered or conn._chunks:
                return conn.take()
            if conn.complete:
                self._done = True
                return None
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.read_timeout)

    async def pump(self, sink: Callable[[bytes], bool], *, once: bool = False) -> None:
        """Hand the body to `sink` as it arrives, from the connection's callbacks: no coroutine
        wakes per chunk (a relayed stream's hundreds of chunks each cost a task step, a future
        and a timer otherwise). `sink(chunk)` returns False, having done nothing, when it cannot
        take `chunk` now (the client is not reading): that chunk and the rest stay buffered,
        with flow control, and this returns; so it does at the body's end, where `stream()`
        then ends at once. With `once`, returns after the first chunk `sink` took. Raises what
        `stream()` would (ReadTimeout after `read_timeout` seconds without bytes,
        Disconnected), and what `sink` raised."""
        conn = self._conn
        if conn._chunks:  # arrived before the pump started (take() joins them)
            data = conn.take()
            if not sink(data):
                conn.untake(data)
                return
            if once:
                return
        if conn.complete or conn.error is not None:
            return  # stream() reports them
        loop = conn.loop
        conn.sink, conn.sink_error, conn.sink_once, conn.last_rx = sink, None, once, loop.time()
        self._idle_timer = loop.call_at(conn.last_rx + self.read_timeout, self._idle_check)
        try:
            while conn.sink is not None and not conn.complete and conn.error is None:
                waiter = conn._waiter = loop.create_future()
                await waiter
            if conn.sink_error is not None:
                raise conn.sink_error
        finally:
            conn.sink = None
            conn.sink_once = False
            conn._waiter = None
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None

    def _idle_check(self) -> None:
        """One timer per read timeout while pumping, rather than one per chunk."""
        conn = self._conn
        due = conn.last_rx + self.read_timeout
        if conn.loop.time() < due:
            self._idle_timer = conn.loop.call_at(due, self._idle_check)
            return
        self._idle_timer = None
        conn._fail(ReadTimeout("no answer from the server within the read timeout"))
        conn._wake()

    async def stream(self) -> AsyncIterator[bytes]:
        while (chunk := await self._next_chunk()) is not None:
            yield chunk

    async def read(self) -> bytes:
        # Not through stream(): an async generator registers with the loop's generator hooks,
        # a measurable cost on every non-streamed request.
        conn = self._conn
        if conn.complete:  # all of it is here already (a small answer): no await at all
            self._done = True
            return conn.take() if conn._chunks else b""
        parts: list[bytes] = []
        while (chunk := await self._next_chunk()) is not None:
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            self._pool._release(conn, reusable=self._done and conn.complete and conn.keep_alive)


class H1Pool:
    """Keep-alive connections to one origin (scheme://host:port; a path in `url` is ignored).
    A `Transport`."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        keepalive_expiry: float = 30.0,
        tls_context: ssl.SSLContext | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        """`outbox`: where requests wait for the end of the loop turn; pools that share one
        send all of a turn's requests together."""
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        default_port = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        self.host_header = (self.host if default_port else f"{self.host}:{self.port}").encode()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._ssl: ssl.SSLContext | None = None
        if self.tls:
            self._ssl = tls_context or ssl.create_default_context()
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._outbox = outbox or Outbox()

    @property
    def open_connections(self) -> int:
        return self._open

    async def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes = b"",
        *,
        read_timeout: float | None = None,
    ) -> Response:
        """Send one request; returns once the response headers arrived. `path` is the full
        request target; `read_timeout` overrides the pool's for this request."""
        limit = self.read_timeout if read_timeout is None else read_timeout
        head = [f"{method} {path} HTTP/1.1\r\nhost: ".encode(), self.host_header, b"\r\n"]
        for name, value in headers:
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if body or method == "POST":
            head.append(f"content-length: {len(body)}\r\n".encode())
        head.append(b"\r\n")
        data = b"".join(head) + body
        conn = self._idle_connection()  # the usual case, without a coroutine of its own
        reused = conn is not None
        if conn is None:
            conn, reused = await self._acquire()
        try:
            return await self._exchange(conn, data, limit)
        except Disconnected:
            if not reused or conn.got_bytes:
                raise
        # The idle connection had been closed by the server: once more on a fresh one.
        conn, _ = await self._acquire(fresh=True)
        return await self._exchange(conn, data, limit)

    async def _exchange(self, conn: _Connection, data: bytes, limit: float) -> Response:
        try:
            conn._reset()
            assert conn.transport is not None
            self._outbox.post(conn, data)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(limit)
            return Response(self, conn, limit)
        except BaseException:
            self._release(conn, reusable=False)
            raise

    async def _acquire(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        if self._closed:
            raise ConnectFailed("the client is closed")
        if not fresh and (idle := self._idle_connection()) is not None:
            return idle, True
        while self._open >= self.max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, self.connect_timeout)
            except TimeoutError:
                raise ConnectFailed(f"no free connection within {self.connect_timeout:g}s") from None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if self._idle and not fresh:
                return await self._acquire()
        self._open += 1
        try:
            return await self._connect(), False
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    def _idle_connection(self) -> _Connection | None:
        """The most recently used idle connection that is still usable (the ones that are not
        are dropped), or None."""
        idle = self._idle
        if not idle or self._closed:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now, self.keepalive_expiry):
                return conn
            self._discard(conn)
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                ),
                self.connect_timeout,
            )
        except TimeoutError:
            raise ConnectFailed(f"connect timed out after {self.connect_timeout:g}s") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from None
        return conn

    def _release(self, conn: _Connection, *, reusable: bool) -> None:
        if reusable and not self._closed and not conn.closed:
            conn.last_used = time.monotonic()
            self._idle.append(conn)
        else:
            self._discard(conn)
        self._wake_one()

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._discard(conn)


__all__: list[Any] = ["ConnectFailed", "Disconnected", "H1Pool", "ReadTimeout", "Response", "UpstreamError"]
