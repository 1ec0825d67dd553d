"""A minimal HTTP server for `/healthz` and `/metrics` (asyncio streams, no framework): two
GET endpoints need no more, and a framework server would take over the process's signals.
Requests are bounded (8 KiB of head, 5 s to send it); anything else gets a 404/405."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from continuum_common.exposition import render

log = logging.getLogger("continuum.indexer.http")
_MAX_HEAD = 8192
_READ_TIMEOUT_S = 5.0

HealthCheck = Callable[[], tuple[bool, dict[str, object]]]


class HealthServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, health: HealthCheck) -> None:
        self.host = host
        self.port = port
        self.registry = registry
        self.health = health
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=_MAX_HEAD)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("health and metrics on http://%s:%d", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].split("?", 1)[0]
            status, ctype, body = await self._route(method, path)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        try:
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            async with asyncio.timeout(_READ_TIMEOUT_S):
                await writer.drain()
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if path not in ("/healthz", "/metrics"):
            return 404, "text/plain", b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, await render(self.registry)
        ok, details = self.health()
        return (
            (200 if ok else 503),
            "application/json",
            orjson.dumps({"status": "ok" if ok else "unavailable", **details}),
        )


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
