"""Metrics across the workers of one `serve`: a scrape reaches one worker, which answers for all.

Every worker (and the supervisor) serves its own text exposition on a Unix socket in the
supervisor's private directory (workers.py): a connection gets the text, then EOF; nothing is
read from it. The worker a scrape reaches asks its siblings and the supervisor at once (bounded
by `timeout_s`), merges their families with its own under a `worker` label
(protocol/exposition.py) and answers. A sibling that does not answer in time (restarting,
stuck) is left out of that answer and counted in `continuum_ingress_worker_scrape_failures_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from continuum_common.config import RouterConfig
from continuum_common.exposition import Families
from continuum_common.exposition import render as render_exposition
from continuum_ingress.metrics import WorkerScrapeMetrics
from continuum_ingress.protocol.exposition import ExpositionError, families, merge
from continuum_ingress.workers import SUPERVISOR, WorkerSeat

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 2.0
MAX_EXPOSITION_BYTES = 16 * 1024 * 1024
WRITE_TIMEOUT_S = 5.0


async def serve_exposition(path: Path, registry: CollectorRegistry) -> asyncio.Server:
    """Serve `registry`'s text exposition on a Unix socket at `path` (a stale file is replaced)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await render_exposition(registry))
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await writer.drain()
        except (OSError, TimeoutError):
            pass  # the asking worker gave up; it counts the failure
        finally:
            writer.close()

    remove_socket_file(path)
    return await asyncio.start_unix_server(answer, path=str(path))


async def close_exposition(server: asyncio.Server, path: Path) -> None:
    server.close()
    with contextlib.suppress(Exception):
        await server.wait_closed()
    remove_socket_file(path)


def remove_socket_file(path: Path) -> None:
    """A socket file in the private directory (a metadata change on a local file system)."""
    with contextlib.suppress(OSError):
        path.unlink()


async def fetch_exposition(path: Path, timeout_s: float = SCRAPE_TIMEOUT_S) -> bytes:
    """Another process's text exposition. Raises OSError, TimeoutError or ExpositionError."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_unix_connection(str(path))
        try:
            data = await reader.read(MAX_EXPOSITION_BYTES + 1)
            chunks = [data]
            total = len(data)
            while data and total <= MAX_EXPOSITION_BYTES:
                data = await reader.read(MAX_EXPOSITION_BYTES + 1 - total)
                chunks.append(data)
                total += len(data)
        finally:
            writer.close()
    if total > MAX_EXPOSITION_BYTES:
        raise ExpositionError(f"metrics exposition larger than {MAX_EXPOSITION_BYTES} bytes")
    return b"".join(chunks)


class WorkerMetrics:
    """A `Component` of a worker's app: serves this worker's metrics to its siblings, and builds
    the merged answer of its own `/metrics`."""

    def __init__(self, seat: WorkerSeat, registry: CollectorRegistry, *, timeout_s: float = SCRAPE_TIMEOUT_S) -> None:
        self.seat = seat
        self.registry = registry
        self.timeout_s = timeout_s
        self.metrics = WorkerScrapeMetrics(registry)
        self._server: asyncio.Server | None = None

    @property
    def path(self) -> Path:
        return self.seat.metrics_socket(self.seat.index)

    async def start(self) -> None:
        self._server = await serve_exposition(self.path, self.registry)

    def reload(self, config: RouterConfig) -> None:
        """Nothing to reload."""

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await close_exposition(server, self.path)

    async def exposition(self) -> bytes:
        """Every worker's metrics (and the supervisor's), each sample labelled with its worker."""
        names: list[str] = [*(str(i) for i in self.seat.others()), SUPERVISOR]
        fetched = await asyncio.gather(
            *(fetch_exposition(self.seat.metrics_socket(n), self.timeout_s) for n in names), return_exceptions=True
        )
        sources: list[tuple[str | None, list[Metric]]] = []
        for name, result in zip(names, fetched, strict=True):
            try:
                if isinstance(result, BaseException):
                    raise result
                sources.append((None if name == SUPERVISOR else name, await _parse(result)))
            except Exception as exc:  # gone, slow, unreadable: this answer goes without it
                self.metrics.failures.inc()
                log.debug("metrics of %s not included: %s", name, type(exc).__name__)
        own = (str(self.seat.index), await _parse(await render_exposition(self.registry)))
        return await render_exposition(Families(merge([own, *sources])))


async def _parse(text: bytes) -> list[Metric]:
    """Parse a process's exposition with a turn of the event loop after each family: a sibling's
    text takes milliseconds to parse, and requests wait for whatever holds the loop."""
    parsed: list[Metric] = []
    for family in families(text):
        parsed.append(family)
        await asyncio.sleep(0)
    return parsed
