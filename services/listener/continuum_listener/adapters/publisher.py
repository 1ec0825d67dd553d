"""Normalized events → JetStream stream CONTINUUM_KV (DESIGN.md §5).

* Subject `continuum.kv.events.<backend>`, header `Nats-Msg-Id` = `<backend>:<epoch>:<seq>`
  (JetStream drops a re-sent event inside the stream's duplicate window) and a W3C
  `traceparent` (one trace per event: the indexer continues it).
* Publishing is pipelined: up to `window` events are in flight, acknowledged in order. An
  acknowledgement that fails or takes longer than the bus request timeout sends every
  unacknowledged event again, in order (de-duplicated by Msg-Id).
* While NATS is unreachable, events wait in a bounded buffer (`limits.publish_buffer`). When it is
  full the oldest waiting event is dropped and counted, and its backend is asked to resync (a new
  epoch that restates its state), so a consumer never keeps a half-applied history.
* The stream is created when missing (`bus.stream` limits); an existing stream is left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.js.api import PubAck
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError
from opentelemetry.trace import SpanKind

from continuum_common.bus import connect, ensure_kv_stream
from continuum_common.config.router import Bus
from continuum_common.events import KvEvent
from continuum_common.tracing import Tracing
from continuum_listener.metrics import ListenerMetrics

log = logging.getLogger("continuum.listener.publisher")


@dataclass(slots=True)
class _Item:
    event: KvEvent
    payload: bytes
    headers: dict[str, str]
    created: float


def traceparent() -> str:
    """A new root context: the indexer's spans for this event start a trace of their own."""
    ids = os.urandom(24).hex()
    return f"00-{ids[:32]}-{ids[32:]}-01"


def trace_headers(event: KvEvent, tracing: Tracing | None) -> dict[str, str]:
    """`traceparent` for one event: a real "kv.event publish" span when tracing is on (the
    indexer continues it), else a fresh random root context (always present, per DESIGN.md §5)."""
    if tracing is None or not tracing.enabled:
        return {"traceparent": traceparent()}
    with tracing.tracer.start_as_current_span(
        "kv.event publish",
        kind=SpanKind.PRODUCER,
        attributes={
            "continuum.backend": event.backend,
            "continuum.event": event.type.value,
            "continuum.seq": event.seq,
        },
    ):
        headers: dict[str, str] = {}
        tracing.inject(headers)
    return headers or {"traceparent": traceparent()}


class JetStreamPublisher:
    def __init__(
        self,
        cfg: Bus,
        metrics: ListenerMetrics,
        *,
        capacity: int,
        name: str = "continuum-kv-listener",
        window: int = 512,
        on_overflow: Callable[[str], None] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.cfg = cfg
        self.tracing = tracing
        self.metrics = metrics
        self.capacity = capacity
        self.name = name
        self.window = window
        self.on_overflow = on_overflow or (lambda _backend: None)
        self.ack_timeout = max(cfg.request_timeout_ms / 1000, 0.5)
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None
        self.ready = asyncio.Event()  # connected and the stream exists
        self._buffer: deque[_Item] = deque()
        self._inflight: deque[tuple[_Item, asyncio.Future[PubAck]]] = deque()
        self._wake = asyncio.Event()
        self._online = asyncio.Event()
        self._closing = False
        self._idle = asyncio.Event()  # nothing buffered or in flight
        self._idle.set()

    # -- producer side (synchronous, never blocks) ----------------------------------------------

    @property
    def pending(self) -> int:
        return len(self._buffer) + len(self._inflight)

    def room(self) -> int:
        return self.capacity - self.pending

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def submit(self, event: KvEvent) -> None:
        if self.pending >= self.capacity:
            victim = self._buffer.popleft().event if self._buffer else event
            self.metrics.drop(victim.backend, "publish_buffer_full")
            self.on_overflow(victim.backend)
            if victim is event:
                return
        headers = {"Nats-Msg-Id": event.msg_id, **trace_headers(event, self.tracing)}
        self._buffer.append(_Item(event, event.encode(), headers, time.monotonic()))
        self._idle.clear()
        self.metrics.publish_buffer.set(self.pending)
        self._wake.set()

    # -- connection ------------------------------------------------------------------------------

    async def _on_disconnect(self) -> None:
        self._online.clear()
        self.metrics.bus_connected.set(0)
        if not self._closing:
            log.warning("NATS disconnected; buffering up to %d events", self.capacity)

    async def _on_reconnect(self) -> None:
        self._online.set()
        self.metrics.bus_connected.set(1)
        log.info("NATS reconnected")
        self._wake.set()

    async def _connect(self) -> None:
        self.nc = await connect(
            self.cfg, name=self.name, on_disconnect=self._on_disconnect, on_reconnect=self._on_reconnect
        )
        self.js = self.nc.jetstream(timeout=self.ack_timeout * 4, publish_async_max_pending=self.window)
        self._online.set()
        self.metrics.bus_connected.set(1)
        backoff = 0.25
        while True:
            try:
                await ensure_kv_stream(self.js, self.cfg)
                break
            except Exception as exc:  # JetStream API errors, timeouts while the server restarts
                log.warning("cannot ensure stream CONTINUUM_KV (%s); retrying", type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
        self.ready.set()

    # -- publishing loop -------------------------------------------------------------------------

    async def run(self) -> None:
        await self._connect()
        while True:
            await self._pump()

    async def _pump(self) -> None:
        if not self._buffer and not self._inflight:
            self._wake.clear()
            await self._wake.wait()
            return
        if not self._online.is_set():
            await self._online.wait()
            return
        assert self.js is not None
        while self._buffer and len(self._inflight) < self.window and self._online.is_set():
            item = self._buffer.popleft()
            try:
                future = await self.js.publish_async(item.event.subject, item.payload, headers=item.headers)
            except Exception as exc:  # the connection went away under us
                self._buffer.appendleft(item)
                log.debug("publish failed: %s", type(exc).__name__)
                await asyncio.sleep(0.05)
                return
            self._inflight.append((item, future))
        if self._inflight:
            await self._collect_first()

    async def _collect_first(self) -> None:
        item, future = self._inflight[0]
        try:
            await asyncio.wait_for(asyncio.shield(future), self.ack_timeout)
        except TimeoutError:
            self._resend("ack timeout")
            return
        except NoStreamResponseError:
            assert self.js is not None
            with contextlib.suppress(Exception):
                await ensure_kv_stream(self.js, self.cfg)
            self._resend("no stream")
            await asyncio.sleep(0.1)
            return
        except APIError as exc:
            # A permanent rejection of this one message (e.g. over the max payload): drop it.
            self._inflight.popleft()
            self.metrics.drop(item.event.backend, "other")
            log.warning("JetStream rejected an event of %s: %s", item.event.backend, exc.description)
            return
        except Exception as exc:
            self._resend(type(exc).__name__)
            await asyncio.sleep(0.1)
            return
        self._inflight.popleft()
        self.metrics.publish_latency.observe(time.monotonic() - item.created)
        self.metrics.publish_buffer.set(self.pending)
        if not self.pending:
            self._idle.set()

    def _resend(self, why: str) -> None:
        """Put every unacknowledged event back in front of the buffer, in order."""
        log.debug("resending %d events (%s)", len(self._inflight), why)
        items = []
        while self._inflight:
            item, future = self._inflight.popleft()
            future.cancel()  # releases the client's pending-publish slot
            items.append(item)
        self._buffer.extendleft(reversed(items))

    async def close(self, deadline: float = 5.0) -> None:
        """Publish what is buffered (until `deadline` seconds), then drain the connection."""
        end = time.monotonic() + deadline
        self._closing = True
        if self.connected:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), deadline)
        if self.pending:
            log.warning("shutting down with %d unpublished events", self.pending)
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), max(0.1, end - time.monotonic()))
            with contextlib.suppress(Exception):
                await self.nc.close()
