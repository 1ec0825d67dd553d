"""Run an ASGI app under uvicorn as a task of the current event loop (no thread, no second
loop), on a socket bound before start so port 0 gives a free port without a race.

Used for HTTP surfaces that live beside other work in one process: the listener's SSE feed,
a service's `/metrics` + `/healthz`, and the fake servers of the test harnesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any, Literal, Self

import uvicorn

from continuum_common.errors import ListenError


def bind_tcp(host: str, port: int, *, backlog: int | None = None, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free one), listening when `backlog` is given
    (which also keeps the port from other sockets that set SO_REUSEADDR). Raises ListenError
    with one line (`cannot listen on 127.0.0.1:8080: address already in use`).

    `reuse_port`: SO_REUSEPORT, for the workers of one `serve`, which all listen on the port
    their supervisor holds (`hold_tcp_port`); the kernel spreads new connections over them."""
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is
    # IPPROTO_TCP, and accepted connections inherit proto 0 otherwise. Without it Nagle holds
    # the response body behind its headers until the client's delayed ACK (~40 ms a request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if backlog is not None:
            sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise _listen_error(host, port, exc) from None
    return sock


def hold_tcp_port(host: str, port: int) -> socket.socket:
    """Take host:port (port 0: a free one) for workers that will listen on it with SO_REUSEPORT
    (`bind_tcp(..., reuse_port=True)`), without listening: the kernel hands connections only to
    listening sockets. SO_REUSEPORT is set after the bind, so the bind itself still fails while
    another server (another `serve` and its workers included) listens on the port. Raises
    ListenError."""
    sock = bind_tcp(host, port)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError as exc:
        sock.close()
        raise _listen_error(host.strip("[]"), port, exc) from None
    return sock


def _listen_error(host: str, port: int, exc: OSError) -> ListenError:
    shown = f"[{host}]" if ":" in host else host
    reason = (exc.strerror or str(exc)).lower()
    return ListenError(f"cannot listen on {shown}:{port}: {reason}")


# How often a stopping server checks whether its connections have closed.
DRAIN_POLL_S = 0.005
# How often the main loop refreshes the Date header (uvicorn's own rate).
DATE_REFRESH_S = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server, stopped as soon as it is asked to.

    uvicorn polls its stop flag every 100 ms, then sleeps another 100 ms after asking its
    connections to close and polls them every 100 ms: 100-200 ms of every stop spent asleep, in
    which a restarted router is out of its load balancer (docs/benchmarks.md, "Start and
    stop"). Here the stop flag wakes the main loop, and the drain checks its connections every
    5 ms; what is drained and how long it may take are uvicorn's."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)

    @property  # uvicorn's is a plain attribute; a stop request must also wake main_loop
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    # The owning process handles SIGINT/SIGTERM itself (`serve` and `up` install their own
    # handlers; tests install none); uvicorn must not take them over.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        # on_tick(0) refreshes the Date header and says whether to stop.
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), DATE_REFRESH_S)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()  # an idle connection closes now, a busy one after its response
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                # uvicorn's connection and task sets signal nothing when they empty
                while (state.connections or state.tasks) and not self.force_exit:  # noqa: ASYNC110
                    await asyncio.sleep(DRAIN_POLL_S)
                for server in self.servers:
                    await server.wait_closed()
        except TimeoutError:
            for task in state.tasks:
                task.cancel(msg="the graceful shutdown's time ran out")
        if not self.force_exit:
            await self.lifespan.shutdown()


class EmbeddedServer:
    """An ASGI app served by uvicorn in the caller's event loop, on a socket bound (and
    listening) at construction, so a port in use is one ListenError before anything starts and
    `port` is known at once (port 0 picks a free one). `sock`: a socket the caller bound already
    (`bind_tcp`).

    `await start()` / `async with` return once it accepts connections; `await stop()` (or the
    end of the `async with`) drains it, bounded by `timeout_graceful_shutdown`. `http` is
    uvicorn's protocol setting: a name, or a protocol class (the router passes its edge
    protocol, continuum_ingress.edge). `lifespan="on"` runs the app's start-up and shut-down."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sock: socket.socket | None = None,
        backlog: int = 2048,
        timeout_keep_alive: int = 5,
        timeout_graceful_shutdown: int = 2,
        http: str | type[asyncio.Protocol] = "auto",
        lifespan: Literal["auto", "on", "off"] = "off",
        log_level: str = "warning",
        server_header: bool = True,
    ) -> None:
        self.host = host.strip("[]")
        self._sock = sock if sock is not None else bind_tcp(self.host, port, backlog=backlog)
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            loop="none",  # the caller's loop
            http=http,
            lifespan=lifespan,
            log_level=log_level,
            log_config=None,
            access_log=False,
            server_header=server_header,
            timeout_graceful_shutdown=timeout_graceful_shutdown,
            backlog=backlog,
            timeout_keep_alive=timeout_keep_alive,
            # No service reads the client address from the scope, so X-Forwarded-For is not
            # rewritten into it (one middleware less per request).
            proxy_headers=False,
        )
        self.server = _Server(config)
        # Past the graceful drain, stop() cancels what is left.
        self._stop_timeout = timeout_graceful_shutdown + 3
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """Where a local client reaches the server (a wildcard bind is reached on loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def started(self) -> bool:
        return self.server.started

    async def serve(self) -> None:
        """Serve until `request_stop()`, in the caller's task: for a composition root that owns
        its tasks in a TaskGroup (`start()`/`stop()` manage a task of their own instead)."""
        try:
            await self.server.serve(sockets=[self._sock])
        finally:
            self._sock.close()

    def request_stop(self) -> None:
        self.server.should_exit = True

    async def start(self) -> None:
        if self._task is not None:
            return
        self._task = asyncio.create_task(self.serve(), name=f"http:{self.port}")
        while not self.server.started:
            if self._task.done():
                self._task.result()  # raises the start-up error
                raise RuntimeError("HTTP server stopped during start-up")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            self._sock.close()
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(task, self._stop_timeout)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._sock.close()

    async def wait(self) -> None:
        """Until the server stops (a stop request, or its task failing)."""
        if self._task is not None:
            await self._task

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
