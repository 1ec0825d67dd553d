"""One seed-compatible SSE event source (`kv_cache_index.event_sources[]`, `transport: sse`).

http/https endpoints are read with an httpx streaming GET (`Accept: text/event-stream`); ws/wss
endpoints with a websocket whose messages carry the same SSE bytes. Either way the bytes go
through continuum_common.kvindex.sse.SseParser, so both schemes behave the same:

* reconnect after any failure or stream end with exponential backoff from
  `reconnect_interval_ms` to max(reconnect_interval_ms, 60 s); reset once events flow again;
* resume with `Last-Event-ID` = the id of the last record that reached the index (applied or
  deliberately dropped), so an index outage never skips events: while the index is down the
  source retries the same batch and stops reading, and the listener's bounded history covers
  the gap on reconnect;
* a record over 1 MiB before its blank line drops the connection (SseLimitError), then back
  off and resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httpx

from continuum_common.backoff import Backoff
from continuum_common.config.kv_index import EventSource
from continuum_common.events import KvEvent
from continuum_common.kvindex import KvIndexError
from continuum_common.kvindex.sse import (
    CLOSING_EVENTS,
    CONTROL_EVENTS,
    SseError,
    SseEventError,
    SseLimitError,
    SseParser,
    SseRecord,
    parse_body,
    record_to_event,
    record_type,
)
from continuum_common.wire.indexer_admin import SourceStats
from continuum_indexer.errors import IndexerError
from continuum_indexer.event_sink import EventSink

log = logging.getLogger("continuum.indexer.sse")
_MAX_WS_MESSAGE = 2 << 20


class SseStreamEnded(IndexerError):
    """The server ended the stream (or announced it would: draining, buffer_overflow)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SseSource:
    def __init__(
        self,
        source: EventSource,
        sink: EventSink,
        *,
        connect_timeout_s: float = 5.0,
        idle_timeout_s: float = 300.0,
        max_batch: int = 500,
    ) -> None:
        if source.endpoint is None:
            raise ValueError("an SSE source needs an endpoint")
        self.source = source
        self.backend = source.backend_name
        self.endpoint = source.endpoint
        self.sink = sink
        self.connect_timeout_s = connect_timeout_s
        # No record for this long: reconnect (resuming loses nothing); a timeout on every read.
        self.idle_timeout_s = idle_timeout_s
        self.max_batch = max_batch
        self.stats = SourceStats(self.backend, "sse")
        self.last_event_id: str | None = None  # last id whose record reached the index
        self._backoff = Backoff.for_sse_source(source.reconnect_interval_ms)
        self._arrival_epoch = 0
        self._arrival_seq = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            delay = self._backoff.next()
            try:
                await self._connect_once()
                reason = "stream ended"
            except SseStreamEnded as ended:
                reason = ended.reason
                if reason == "draining":
                    delay = self._backoff.initial  # the listener is restarting, come back soon
            except SseLimitError as exc:
                reason = str(exc)
            except (httpx.HTTPError, OSError, TimeoutError, SseError, IndexerError) as exc:
                reason = type(exc).__name__
            except Exception as exc:  # websockets raises its own hierarchy; never crash the source
                if isinstance(exc, asyncio.CancelledError):  # pragma: no cover - not an Exception
                    raise
                reason = type(exc).__name__
            self._set_connected(False)
            self.stats.reconnect_count += 1
            self.sink.metrics.reconnects.labels(self.sink.metrics.backend(self.backend)).inc()
            log.info("SSE source %s disconnected (%s); reconnecting in %.2fs", self.backend, reason, delay)
            await asyncio.sleep(delay)

    def _set_connected(self, connected: bool) -> None:
        self.stats.connected = connected
        self.sink.metrics.connected.labels(self.sink.metrics.backend(self.backend)).set(1 if connected else 0)

    async def _connect_once(self) -> None:
        parser = SseParser()
        parser.last_event_id = self.last_event_id
        async with self._open() as chunks:
            self._set_connected(True)
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout_s):  # not wait_for (see adapters/pull.py)
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                records = parser.feed(chunk)
                if records:
                    await self._handle(records)

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[AsyncIterator[bytes]]:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        scheme = urlsplit(self.endpoint).scheme
        if scheme in ("ws", "wss"):
            async with self._open_ws(headers) as chunks:
                yield chunks
            return
        timeout = httpx.Timeout(self.connect_timeout_s, read=self.idle_timeout_s)
        async with (
            httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
            client.stream("GET", self.endpoint, headers=headers) as response,
        ):
            if response.status_code != 200:
                raise SseStreamEnded(f"HTTP {response.status_code}")
            yield response.aiter_bytes()

    @asynccontextmanager
    async def _open_ws(self, headers: dict[str, str]) -> AsyncIterator[AsyncIterator[bytes]]:
        from websockets.asyncio.client import connect

        async def frames(ws: object) -> AsyncIterator[bytes]:
            async for message in ws:  # type: ignore[attr-defined]
                yield message.encode() if isinstance(message, str) else bytes(message)

        async with connect(
            self.endpoint,
            additional_headers=headers,
            open_timeout=self.connect_timeout_s,
            max_size=_MAX_WS_MESSAGE,
        ) as ws:
            yield frames(ws)

    # ---- records -----------------------------------------------------------------------------

    def _arrival(self) -> tuple[int, int]:
        """A stamp for records that carry none: arrival order, with a wall-clock epoch so a
        restarted or second indexer's stamps are comparable (last writer wins)."""
        self._arrival_epoch = max(self._arrival_epoch, int(time.time() * 1000))
        self._arrival_seq += 1
        return self._arrival_epoch, self._arrival_seq

    async def _handle(self, records: list[SseRecord]) -> None:
        events: list[KvEvent] = []
        closing: str | None = None
        for record in records:
            body = parse_body(record)
            name = record_type(record, body)
            if name in CONTROL_EVENTS:
                closing = name if name in CLOSING_EVENTS else closing
                continue
            self.stats.events_received += 1
            self.sink.received(self.backend, "sse")
            try:
                events.append(
                    record_to_event(record, body, backend=self.backend, arrival=self._arrival(), now=time.time())
                )
            except SseEventError as exc:
                self.stats.events_dropped += 1
                self.sink.dropped(self.backend, exc.reason)
                log.warning("dropped SSE event from %s (%s) id=%s", self.backend, exc.reason, (record.id or "-")[:64])
        for start in range(0, len(events), self.max_batch):
            await self._apply(events[start : start + self.max_batch])
        if records:
            self.last_event_id = records[-1].id
        if events:
            self.stats.saw_events(0)
            self._backoff.reset()
        if closing is not None:
            raise SseStreamEnded(closing)

    async def _apply(self, events: list[KvEvent]) -> None:
        """Apply until the index takes it: the stream waits (the listener buffers or closes
        with buffer_overflow, and we resume from the last applied id)."""
        retry = Backoff(0.1, 5.0)
        while True:
            try:
                await self.sink.apply(events)
                return
            except KvIndexError as exc:
                delay = retry.next()
                log.warning("index write failed for SSE source %s (%s); retry in %.1fs", self.backend, exc, delay)
                await asyncio.sleep(delay)
