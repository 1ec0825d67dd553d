"""The router's HTTP server: continuum_common.asgi_server.EmbeddedServer (uvicorn's server in the
caller's event loop, no signal capture: `serve` and `up` install their own handlers) with the
router's settings - the app's lifespan, no Server header, a 30 s graceful drain - and, with an
`edge`, the router's own HTTP/1.1 protocol (adapters/h1_server.py) enforcing the edge limits
(continuum_ingress.edge); without one, uvicorn's httptools protocol."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Collection
from typing import Any

from continuum_common.asgi_server import EmbeddedServer
from continuum_ingress.adapters.h1_server import protocol_factory
from continuum_ingress.edge import EdgeGuard


class RunningServer(EmbeddedServer):
    """`async with RunningServer(app, host, port) as server:` - listening on exit of __aenter__
    (port 0 picks a free port; read it from `server.port`), drained and stopped on exit.

    The socket is bound at construction, before uvicorn runs the app's start-up, so a port in
    use is one ListenError (`cannot listen on HOST:PORT: address already in use`) before
    anything logs "ready". `sock`: a socket the caller bound already (`bind_tcp`), e.g. `up`,
    which takes its port before it starts any other process."""

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
        super().__init__(
            app,
            host,
            port,
            sock=sock,
            http="httptools" if edge is None else protocol_factory(edge),
            lifespan="on",
            log_level=log_level,
            server_header=False,
            timeout_keep_alive=30 if edge is None else max(1, round(edge.limits.keepalive_timeout)),
            timeout_graceful_shutdown=30,
        )

    @property
    def url(self) -> str:
        """The address as bound (a wildcard stays a wildcard: the operator sees what listens)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def connections(self) -> Collection[Any]:
        """The client connections (protocol objects) this server holds now."""
        connections: Collection[Any] = self.server.server_state.connections
        return connections

    async def adopt(self, sock: socket.socket) -> None:
        """Serve a connection another process accepted (a sibling worker handed it over), as
        if this server had accepted it. Only once the server has started."""
        server = self.server
        config = server.config
        protocol: Any = config.http_protocol_class  # uvicorn's protocol arguments (typed as a bare Protocol)
        factory = functools.partial(
            protocol, config=config, server_state=server.server_state, app_state=server.lifespan.state
        )
        await asyncio.get_running_loop().connect_accepted_socket(factory, sock)
