"""Run a FastAPI app with uvicorn on a socket we bound, inside the caller's event loop.

Several engines share one process and one loop, so uvicorn's own `serve()` (which installs
signal handlers) is not used: `startup` / `main_loop` / `shutdown` are driven directly and the
composition root owns signals. Binding the socket ourselves lets port 0 pick a free port.
"""

from __future__ import annotations

import socket

import uvicorn
from fastapi import FastAPI


def bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class HttpServer:
    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self._sock = bind_socket(host, port)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
            backlog=2048,
        )
        config.load()
        self._server = uvicorn.Server(config)

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        # What uvicorn's `_serve` does before `startup` (lifespan is "off": a no-op object).
        self._server.lifespan = self._server.config.lifespan_class(self._server.config)
        await self._server.startup(sockets=[self._sock])

    async def serve_until_stopped(self) -> None:
        await self._server.main_loop()

    def request_stop(self) -> None:
        self._server.should_exit = True

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._server.started:
            await self._server.shutdown(sockets=[self._sock])
        else:
            self._sock.close()
