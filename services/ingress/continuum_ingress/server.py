"""Running an ASGI app under uvicorn (uvloop + httptools) inside the caller's event loop.

The caller owns signals (`serve` and `up` install their own handlers; tests install none), so
uvicorn's own signal capture is switched off.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn

from continuum_common.asgi_server import bind_tcp
from continuum_ingress.edge import EdgeGuard


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    @property
    def port(self) -> int:
        for server in self.servers:
            for sock in server.sockets:
                port: int = sock.getsockname()[1]
                return port
        raise RuntimeError("the server is not listening")


def uvicorn_config(
    app: Any, host: str, port: int, *, log_level: str = "warning", edge: EdgeGuard | None = None
) -> uvicorn.Config:
    """uvicorn's settings for the router; with an `edge`, its protocol enforces the edge limits
    (continuum_ingress.edge) and its keep-alive timeout applies."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="none",
        http="httptools" if edge is None else edge.protocol,
        lifespan="on",
        access_log=False,
        server_header=False,
        log_config=None,
        log_level=log_level,
        backlog=2048,
        timeout_keep_alive=30 if edge is None else max(1, round(edge.limits.keepalive_timeout)),
        timeout_graceful_shutdown=30,
    )


class RunningServer:
    """`async with RunningServer(app, host, port) as server:` - listening on exit of __aenter__
    (port 0 picks a free port; read it from `server.port`), drained and stopped on exit.

    The socket is bound before uvicorn runs the app's start-up, so a port in use is one
    ListenError (`cannot listen on HOST:PORT: address already in use`) before anything logs
    "ready". `sock`: a socket the caller bound already (`bind_tcp`), e.g. `up`, which takes its
    port before it starts any other process."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_level: str = "warning",
        edge: EdgeGuard | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        self.server = EmbeddedServer(uvicorn_config(app, host, port, log_level=log_level, edge=edge))
        self._task: asyncio.Task[None] | None = None
        self._sock = sock
        self.host = host

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> RunningServer:
        if self._sock is None:
            config = self.server.config
            self._sock = bind_tcp(self.host, config.port, backlog=config.backlog)
        self._task = asyncio.create_task(self.server.serve(sockets=[self._sock]))
        try:
            while not self.server.started:
                if self._task.done():
                    await self._task  # surfaces the start-up error
                    raise RuntimeError("uvicorn exited during start-up")
                await asyncio.sleep(0.01)
        except BaseException:
            self._sock.close()
            self._sock = None
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await self._task
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def wait(self) -> None:
        if self._task is not None:
            await self._task
