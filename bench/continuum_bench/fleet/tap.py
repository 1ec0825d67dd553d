"""A counting tap in front of the engines' HTTP ports (`bench compare --count-engine-calls`).

Each engine gets a loopback TCP proxy; a router under test is given the proxies' URLs instead of
the engines'. Bytes are relayed unchanged both ways (streaming responses included); on the way
in, the proxy reads just enough HTTP/1.1 framing (request head, then a Content-Length or chunked
body) to count every request by method and path, without the query string. So the benchmark sees
every call a router makes to an engine — completions, `/tokenize`, health checks, metrics
polls — without changing the engine.

Bodies are never read for their content or logged. Memory is bounded: at most `MAX_ROUTES`
distinct routes per engine are counted by name, the rest as `other`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from types import TracebackType
from urllib.parse import urlsplit

from continuum_sim import EngineEndpoints

MAX_ROUTES = 64
MAX_HEAD_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 900.0  # a keep-alive connection idle this long is closed
COPY_CHUNK = 64 * 1024


class HttpFramingError(ValueError):
    """The client sent something that is not HTTP/1.1 framing the tap understands."""


def parse_head(head: bytes) -> tuple[str, str, int | None, bool]:
    """(method, path without query, Content-Length or None, chunked) of a request head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise HttpFramingError("not an HTTP/1.x request line")
    method = parts[0].decode("ascii", "replace")
    path = parts[1].decode("ascii", "replace").split("?", 1)[0]
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"content-length":
            try:
                length = int(value.strip())
            except ValueError as exc:
                raise HttpFramingError("bad Content-Length") from exc
            if length < 0:
                raise HttpFramingError("bad Content-Length")
        elif key == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    return method, path, length, chunked


class EngineTap:
    """`async with EngineTap(endpoints) as tap:` — `tap.endpoints` are the engines with their
    URLs pointing at the proxies; `tap.counts()` the calls so far, `tap.reset()` to start over."""

    def __init__(self, engines: Sequence[EngineEndpoints]) -> None:
        self.engines = list(engines)
        self.endpoints: list[EngineEndpoints] = []
        self._counts: list[Counter[str]] = [Counter() for _ in self.engines]
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        self.errors = 0  # connections closed on bad framing or an unreachable engine

    async def __aenter__(self) -> EngineTap:
        try:
            for index, engine in enumerate(self.engines):
                server = await asyncio.start_server(
                    functools.partial(self._accept, index), "127.0.0.1", 0, limit=MAX_HEAD_BYTES
                )
                self._servers.append(server)
                port = server.sockets[0].getsockname()[1]
                self.endpoints.append(replace(engine, url=f"http://127.0.0.1:{port}"))
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def counts(self) -> dict[str, dict[str, int]]:
        """Calls per engine name, by "METHOD /path"."""
        return {e.name: dict(c) for e, c in zip(self.engines, self._counts, strict=True)}

    def totals(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for counter in self._counts:
            total.update(counter)
        return dict(total)

    def reset(self) -> None:
        for counter in self._counts:
            counter.clear()

    def _count(self, index: int, method: str, path: str) -> None:
        counter = self._counts[index]
        route = f"{method} {path}"
        if route not in counter and len(counter) >= MAX_ROUTES:
            route = "other"
        counter[route] += 1

    def _accept(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(index, reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = urlsplit(self.engines[index].url)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(upstream.hostname, upstream.port), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            self.errors += 1
            writer.close()
            return
        back = asyncio.create_task(_relay(up_reader, writer))
        clean = False
        try:
            await self._requests(index, reader, up_writer)
            clean = True
        except (HttpFramingError, asyncio.LimitOverrunError, ValueError):
            self.errors += 1
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass  # a side went away: close both
        finally:
            if clean:
                # The client half-closed after its last request: let that response finish
                # streaming back before closing.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(back), IDLE_TIMEOUT_S)
            back.cancel()
            for w in (up_writer, writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()

    async def _requests(self, index: int, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise HttpFramingError("connection closed inside a request head") from exc
                up.write_eof()
                return
            method, path, length, chunked = parse_head(head)
            self._count(index, method, path)
            up.write(head)
            if chunked:
                await _copy_chunked(reader, up)
            elif length:
                await _copy_exact(reader, up, length)
            await up.drain()


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while data := await reader.read(COPY_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int) -> None:
    while length > 0:
        data = await asyncio.wait_for(reader.read(min(length, COPY_CHUNK)), IDLE_TIMEOUT_S)
        if not data:
            raise asyncio.IncompleteReadError(b"", length)
        writer.write(data)
        length -= len(data)
        await writer.drain()


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), IDLE_TIMEOUT_S)
        writer.write(size_line)
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise HttpFramingError("bad chunk size") from exc
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(b"\r\n")
            return
        await _copy_exact(reader, writer, size + 2)  # the chunk and its CRLF
