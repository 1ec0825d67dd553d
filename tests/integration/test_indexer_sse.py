"""The seed-compatible SSE transport against real SSE servers on loopback (plain HTTP written
here with asyncio streams, and a websocket server): event-type precedence, Last-Event-ID
resume, the 1 MiB limits, reconnect backoff, drops, and the ws scheme."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest

from continuum_common.config.kv_index import EventSource
from continuum_common.events import Tier
from continuum_common.kvindex import InMemoryKvIndex, KvHolder
from continuum_common.procs import free_port
from continuum_indexer.adapters.sse_source import SseSource
from continuum_indexer.event_sink import EventSink
from continuum_indexer.metrics import IndexerMetrics
from continuum_testing.kvindex_streams import prefix

Script = Callable[[asyncio.StreamWriter], Awaitable[None]]


class SseServer:
    """HTTP/1.1 server answering each GET with the next script (then closing)."""

    def __init__(self, scripts: list[Script], status: int = 200) -> None:
        self.scripts = scripts
        self.status = status
        self.requests: list[dict[str, Any]] = []
        self.port = free_port()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> SseServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def url(self, path: str = "/events/a") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.requests.append({"at": time.monotonic(), "line": lines[0], "headers": headers})
        script = self.scripts.pop(0) if self.scripts else None
        try:
            if self.status != 200 or script is None:
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
                await script(writer)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


def record(event_id: str | None, event: str | None, body: dict[str, Any]) -> bytes:
    out = b""
    if event_id is not None:
        out += f"id: {event_id}\n".encode()
    if event is not None:
        out += f"event: {event}\n".encode()
    return out + b"data: " + orjson.dumps(body) + b"\n\n"


def created(i: int, tokens: int, **extra: Any) -> dict[str, Any]:
    return {"event": "cache_created", "prefix_hash": prefix(i), "token_count": tokens, **extra}


def send(*chunks: bytes, hold: float = 0.0) -> Script:
    async def script(writer: asyncio.StreamWriter) -> None:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        await asyncio.sleep(hold)

    return script


@contextlib.asynccontextmanager
async def source(
    endpoint: str, interval_ms: int = 20
) -> AsyncIterator[tuple[SseSource, InMemoryKvIndex, IndexerMetrics]]:
    index = InMemoryKvIndex()
    metrics = IndexerMetrics(["a"])
    src = SseSource(
        EventSource(backend_name="a", endpoint=endpoint, reconnect_interval_ms=interval_ms), EventSink(index, metrics)
    )
    task = asyncio.create_task(src.run())
    try:
        yield src, index, metrics
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(predicate: Callable[[], Awaitable[bool] | bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def holders(index: InMemoryKvIndex, i: int) -> list[KvHolder]:
    return await index.query_backends(prefix(i))


async def test_sse_event_field_wins_over_the_json_event() -> None:
    chunks = [
        record("1:1", "cache_created", {"event": "cache_evicted", "prefix_hash": prefix(1), "token_count": 64}),
        record("1:2", None, created(2, 128, tier="storage_warm")),  # warm ignored: tiers off
        record("1:3", None, created(3, 256)),
        record("1:4", None, {"event": "cache_evicted", "prefix_hash": prefix(3)}),
        b": a comment\n\nevent: ping\ndata: {}\n\n",
    ]
    async with SseServer([send(*chunks, hold=5)]) as server, source(server.url()) as (src, index, _):
        await until(lambda: src.last_event_id == "1:4")
        assert await holders(index, 1) == [KvHolder("a", 64, Tier.GPU_HOT)]
        assert await holders(index, 2) == [] and await holders(index, 3) == []
        assert server.requests[0]["headers"]["accept"] == "text/event-stream"
        assert "last-event-id" not in server.requests[0]["headers"]


async def test_resume_from_the_last_event_id_after_a_disconnect() -> None:
    first = send(record("7:1", None, created(1, 10)), record("7:2", None, created(2, 20)))
    second = send(record("7:3", None, created(3, 30)), hold=5)
    async with SseServer([first, second]) as server, source(server.url()) as (src, index, metrics):
        await until(lambda: src.last_event_id == "7:3")
        assert server.requests[1]["headers"]["last-event-id"] == "7:2"
        assert [len(await holders(index, i)) for i in (1, 2, 3)] == [1, 1, 1]
        assert src.stats.reconnect_count >= 1
        assert metrics.reconnects.labels("a")._value.get() >= 1


@pytest.mark.parametrize("shape", ["data_lines", "one_line"])
async def test_one_mebibyte_limits_drop_the_stream_and_resume(shape: str) -> None:
    if shape == "data_lines":  # many data lines and no blank line to end the record
        flood = b"".join(b"data: " + b"x" * 1023 + b"\n" for _ in range(1100))
    else:  # one line that never ends
        flood = b"data: " + b"y" * (1100 * 1024)
    first = send(record("9:1", None, created(1, 10)), b"id: 9:2\n" + flood, hold=5)
    second = send(record("9:3", None, created(3, 30)), hold=5)
    async with SseServer([first, second]) as server, source(server.url()) as (src, index, _):
        await until(lambda: src.last_event_id == "9:3")
        assert server.requests[1]["headers"]["last-event-id"] == "9:1"
        assert len(await holders(index, 1)) == 1 and len(await holders(index, 3)) == 1


async def test_reconnect_backoff_doubles_from_the_interval() -> None:
    async with SseServer([], status=503) as server, source(server.url(), interval_ms=40):
        await until(lambda: len(server.requests) >= 5, timeout=10)
    times = [r["at"] for r in server.requests[:5]]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for gap, want in zip(gaps, (0.04, 0.08, 0.16, 0.32), strict=True):
        assert want * 0.9 <= gap <= want * 3 + 0.1, gaps


async def test_invalid_records_are_counted_and_skipped() -> None:
    chunks = [
        record("1:1", None, {"event": "cache_created", "prefix_hash": "not-hex", "token_count": 5}),
        record("1:2", "cache_exploded", created(1, 5)),
        b"id: 1:3\ndata: [1, 2]\n\n",
        record("1:4", None, created(4, 40, backend="b")),
        record("1:5", None, created(5, 50)),
    ]
    async with SseServer([send(*chunks, hold=5)]) as server, source(server.url()) as (src, index, metrics):
        await until(lambda: src.last_event_id == "1:5")
        assert await holders(index, 5) == [KvHolder("a", 50, Tier.GPU_HOT)]
        assert await holders(index, 4) == []
        assert src.stats.events_dropped == 4
        assert metrics.dropped.labels("a", "invalid")._value.get() == 2
        assert metrics.dropped.labels("a", "unknown_type")._value.get() == 1
        assert metrics.dropped.labels("a", "backend_mismatch")._value.get() == 1
        counters = await index.backend_counters()
        assert counters["a"].dropped == 4 and counters["a"].received == 5


async def test_draining_reconnects_without_backing_off() -> None:
    drain = send(record("2:1", None, created(1, 10)), b"event: draining\ndata: {}\n\n", hold=5)
    after = send(record("2:2", None, created(2, 20)), hold=5)
    async with SseServer([drain, after]) as server, source(server.url(), interval_ms=30) as (src, index, _):
        await until(lambda: src.last_event_id == "2:2")
        assert len(await holders(index, 2)) == 1
        assert server.requests[1]["at"] - server.requests[0]["at"] < 1.0


async def test_cleared_and_stamps_from_the_json_body() -> None:
    chunks = [
        record(None, None, {**created(1, 10), "source_epoch": 3, "seq": 5}),
        record(None, "cache_cleared", {"source_epoch": 3, "seq": 6}),
        record(None, None, {**created(1, 99), "source_epoch": 3, "seq": 4}),  # older than the clear
        record(None, None, {**created(2, 20), "source_epoch": 3, "seq": 7}),
    ]
    async with SseServer([send(*chunks, hold=5)]) as server, source(server.url()) as (_, index, metrics):
        await until(lambda: metrics.applied.labels("stale")._value.get() >= 1)
        await until(lambda: holders(index, 2))
        assert await holders(index, 1) == []


async def test_websocket_endpoint_carries_the_same_bytes() -> None:
    from websockets.asyncio.server import serve

    seen_ids: list[str | None] = []

    async def handler(ws: Any) -> None:
        seen_ids.append(ws.request.headers.get("Last-Event-ID"))
        await ws.send(record("5:1", None, created(1, 11)).decode())
        await ws.send(b"id: 5:2\nevent: cache_created\ndata: " + orjson.dumps(created(2, 22))[:20])
        await ws.send(orjson.dumps(created(2, 22))[20:] + b"\n\n")
        await ws.close()

    port = free_port()
    async with serve(handler, "127.0.0.1", port), source(f"ws://127.0.0.1:{port}/events/a") as (src, index, _):
        await until(lambda: len(seen_ids) >= 2)
        assert await holders(index, 2) == [KvHolder("a", 22, Tier.GPU_HOT)]
        assert seen_ids[:2] == [None, "5:2"] and src.last_event_id == "5:2"
