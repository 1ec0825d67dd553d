"""Run an ASGI app under uvicorn as a task of the current event loop (no thread, no second
loop), on a socket bound before start so port 0 gives a free port without a race.

Used for small HTTP surfaces that live beside other work in one process: a service's
`/metrics` + `/healthz`, and the fake provider servers of the test harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    # The owning process handles SIGINT/SIGTERM itself; uvicorn must not take them over.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class EmbeddedServer:
    """`await start()` returns once the socket accepts connections; `await stop()` closes it."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self._app = app
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        if self._task is not None:
            return
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name=f"http:{self.port}")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the start-up error
                raise RuntimeError("HTTP server stopped during start-up")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            self._sock.close()
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(task, 5)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._sock.close()
