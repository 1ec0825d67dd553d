"""Listener output → JetStream stream CONTINUUM_KV (DESIGN.md §5).

* Two kinds of message, both on `continuum.kv.events.<backend>`: version-2 block batches
  (`submit_batch`, Msg-Id `<backend>:<epoch>:b<seq>`) and version-1 prefix-key events
  (`submit`, Msg-Id `<backend>:<epoch>:<seq>`). Each carries `Nats-Msg-Id` (JetStream drops a
  re-sent message inside the stream's duplicate window) and a W3C `traceparent`.
* Publishing is asynchronous: up to `window` messages await their acknowledgement at once,
  acknowledged in order. An acknowledgement that fails or takes longer than the bus request
  timeout sends every unacknowledged message again, in order (de-duplicated by Msg-Id).
* Backpressure while NATS is up: the queue holds `capacity` messages; when it is full
  `blocked` turns true and sources stop reading their engines (`wait_room`) until it has
  drained to three quarters. Nothing is dropped.
* While NATS is unreachable, messages wait in the same bounded queue and sources keep reading.
  When it is full the oldest waiting message is dropped and counted, and its backend is asked to
  resync (a new epoch that restates its state), so a consumer never keeps a half-applied
  history.
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
from nats.errors import MaxPayloadError
from nats.js.api import PubAck
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError
from opentelemetry.trace import SpanKind

from continuum_common.backoff import Backoff
from continuum_common.bus import connect, ensure_kv_stream
from continuum_common.config.router import Bus
from continuum_common.events import SUBJECT_PREFIX, KvEvent
from continuum_common.tracing import Tracing
from continuum_common.wire.kv import KvBatch, encode_batch
from continuum_listener.metrics import ListenerMetrics

log = logging.getLogger("continuum.listener.publisher")
DEFAULT_MAX_PAYLOAD = 1 << 20  # nats-server's default, until the server tells us its own
_SENDS_PER_YIELD = 16


@dataclass(slots=True)
class _Item:
    subject: str
    backend: str
    payload: bytes
    headers: dict[str, str]
    created: float


def traceparent() -> str:
    """A new root context: the indexer's spans for this message start a trace of their own."""
    ids = os.urandom(24).hex()
    return f"00-{ids[:32]}-{ids[32:]}-01"


def trace_headers(tracing: Tracing | None, name: str, attributes: dict[str, str | int]) -> dict[str, str]:
    """`traceparent` for one message: a real producer span when tracing is on (the indexer
    continues it), else a fresh random root context (always present, per DESIGN.md §5)."""
    if tracing is None or not tracing.enabled:
        return {"traceparent": traceparent()}
    with tracing.tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes):
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
        window: int = 128,
        on_overflow: Callable[[str], None] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.cfg = cfg
        self.tracing = tracing
        self.metrics = metrics
        self.capacity = capacity
        self.resume_at = capacity - capacity // 4
        self.name = name
        self.window = window
        self.on_overflow = on_overflow or (lambda _backend: None)
        self.ack_timeout = max(cfg.request_timeout_ms / 1000, 0.5)
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None
        self.ready = asyncio.Event()  # connected and the stream exists
        self._buffer: deque[_Item] = deque()
        self._inflight: deque[tuple[_Item, asyncio.Future[PubAck], float]] = deque()
        self._progress = asyncio.Event()  # something to send, an ack arrived, or NATS came back
        self._online = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        self._idle = asyncio.Event()  # nothing buffered or in flight
        self._idle.set()

    # -- producer side (synchronous, never blocks) ----------------------------------------------

    @property
    def pending(self) -> int:
        return len(self._buffer) + len(self._inflight)

    @property
    def outstanding(self) -> int:
        return len(self._inflight)

    def room(self) -> int:
        return self.capacity - self.pending

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    @property
    def max_payload(self) -> int:
        if self.nc is not None and self.nc.max_payload > 0:
            return int(self.nc.max_payload)
        return DEFAULT_MAX_PAYLOAD

    @property
    def blocked(self) -> bool:
        """True while sources must not read more: the queue is full and NATS is up."""
        return not self._room.is_set()

    async def wait_room(self) -> None:
        await self._room.wait()

    def submit(self, event: KvEvent) -> None:
        """A version-1 prefix-key event (the prefix pipeline's sink protocol)."""
        headers = {
            "Nats-Msg-Id": event.msg_id,
            **trace_headers(
                self.tracing,
                "kv.event publish",
                {"continuum.backend": event.backend, "continuum.event": event.type.value, "continuum.seq": event.seq},
            ),
        }
        self._enqueue(_Item(event.subject, event.backend, event.encode(), headers, time.monotonic()))

    def submit_batch(self, batch: KvBatch) -> None:
        """A version-2 block batch."""
        headers = {
            "Nats-Msg-Id": batch.msg_id,
            **trace_headers(
                self.tracing,
                "kv.batch publish",
                {"continuum.backend": batch.backend, "continuum.seq": batch.seq, "continuum.events": len(batch.events)},
            ),
        }
        subject = SUBJECT_PREFIX + batch.backend
        self._enqueue(_Item(subject, batch.backend, encode_batch(batch), headers, time.monotonic()))

    def _enqueue(self, item: _Item) -> None:
        if not self._online.is_set() and self.pending >= self.capacity:
            victim = self._buffer.popleft() if self._buffer else item
            self.metrics.drop(victim.backend, "publish_buffer_full")
            self.on_overflow(victim.backend)
            if victim is item:
                return
        self._buffer.append(item)
        self._idle.clear()
        self._progress.set()
        self._changed()

    def _changed(self) -> None:
        pending = self.pending
        self.metrics.publish_buffer.set(pending)
        if not self._online.is_set():
            self._room.set()
        elif pending >= self.capacity:
            self._room.clear()
        elif pending <= self.resume_at:
            self._room.set()
        if not pending:
            self._idle.set()

    # -- connection ------------------------------------------------------------------------------

    async def _on_disconnect(self) -> None:
        self._online.clear()
        self.metrics.bus_connected.set(0)
        self._changed()  # sources keep reading: the bounded queue (with drops) takes over
        if not self._closing:
            log.warning("NATS disconnected; buffering up to %d messages", self.capacity)

    async def _on_reconnect(self) -> None:
        self._online.set()
        self.metrics.bus_connected.set(1)
        self._changed()
        log.info("NATS reconnected")
        self._progress.set()

    async def _connect(self) -> None:
        self.nc = await connect(
            self.cfg, name=self.name, on_disconnect=self._on_disconnect, on_reconnect=self._on_reconnect
        )
        # Twice the window: nats-py keeps a pending slot taken when a publish raises mid-call.
        self.js = self.nc.jetstream(timeout=self.ack_timeout * 4, publish_async_max_pending=2 * self.window)
        self._online.set()
        self._changed()
        self.metrics.bus_connected.set(1)
        backoff = Backoff(0.25, 10.0)
        while True:
            try:
                await ensure_kv_stream(self.js, self.cfg)
                break
            except Exception as exc:  # JetStream API errors, timeouts while the server restarts
                log.warning("cannot ensure stream CONTINUUM_KV (%s); retrying", type(exc).__name__)
                await asyncio.sleep(backoff.next())
        self.ready.set()

    # -- publishing loop -------------------------------------------------------------------------

    async def run(self) -> None:
        await self._connect()
        while True:
            await self._step()

    async def _step(self) -> None:
        await self._reap()
        if not self._online.is_set():
            await self._online.wait()
            return
        if self._buffer and len(self._inflight) < self.window:
            await self._send()
            return
        self._progress.clear()
        if not self._inflight:
            if not self._buffer:
                await self._progress.wait()
            return
        wait = self._inflight[0][2] + self.ack_timeout - time.monotonic()
        if wait <= 0:
            self._resend("ack timeout")
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._progress.wait()

    async def _send(self) -> None:
        assert self.js is not None
        sent = 0
        limit = self.max_payload
        while self._buffer and len(self._inflight) < self.window and self._online.is_set():
            item = self._buffer[0]
            if len(item.payload) > limit:
                # Checked here: nats-py raises MaxPayloadError only after taking a pending slot.
                self._buffer.popleft()
                self._too_large(item)
                continue
            try:
                future = await self.js.publish_async(item.subject, item.payload, headers=item.headers)
            except MaxPayloadError:
                self._buffer.popleft()
                self._too_large(item)
                continue
            except Exception as exc:  # the connection went away under us
                log.debug("publish failed: %s", type(exc).__name__)
                await asyncio.sleep(0.05)
                return
            self._buffer.popleft()
            future.add_done_callback(self._acked)
            self._inflight.append((item, future, time.monotonic()))
            sent += 1
            if sent % _SENDS_PER_YIELD == 0:
                self.metrics.outstanding_acks.set(len(self._inflight))
                await asyncio.sleep(0)  # acks and HTTP requests get their turn
        self.metrics.outstanding_acks.set(len(self._inflight))

    def _too_large(self, item: _Item) -> None:
        self.metrics.drop(item.backend, "too_large")
        log.warning("a message of %s (%d bytes) is over the server's max_payload", item.backend, len(item.payload))
        self.on_overflow(item.backend)

    def _acked(self, _future: asyncio.Future[PubAck]) -> None:
        self._progress.set()

    async def _reap(self) -> None:
        """Settle the acknowledged head of the in-flight queue, in order."""
        latency = self.metrics.publish_latency
        while self._inflight and self._inflight[0][1].done():
            item, future, _sent = self._inflight[0]
            exc = None if future.cancelled() else future.exception()
            if exc is None:
                self._inflight.popleft()
                latency.observe(time.monotonic() - item.created)
                continue
            if isinstance(exc, NoStreamResponseError):
                assert self.js is not None
                with contextlib.suppress(Exception):
                    await ensure_kv_stream(self.js, self.cfg)
                self._resend("no stream")
                await asyncio.sleep(0.1)
                break
            if isinstance(exc, APIError):
                # A permanent rejection of this one message (e.g. over the max payload): drop it.
                self._inflight.popleft()
                self.metrics.drop(item.backend, "other")
                self.on_overflow(item.backend)
                log.warning("JetStream rejected a message of %s: %s", item.backend, exc.description)
                continue
            self._resend(type(exc).__name__)
            await asyncio.sleep(0.1)
            break
        self.metrics.outstanding_acks.set(len(self._inflight))
        self._changed()

    def _resend(self, why: str) -> None:
        """Put every unacknowledged message back in front of the buffer, in order."""
        log.debug("resending %d messages (%s)", len(self._inflight), why)
        items = []
        while self._inflight:
            item, future, _sent = self._inflight.popleft()
            future.remove_done_callback(self._acked)
            future.cancel()  # releases the client's pending-publish slot
            items.append(item)
        self._buffer.extendleft(reversed(items))
        self.metrics.outstanding_acks.set(0)

    async def close(self, deadline: float = 5.0) -> None:
        """Publish what is buffered (until `deadline` seconds), then drain the connection."""
        end = time.monotonic() + deadline
        self._closing = True
        if self.connected:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), deadline)
        if self.pending:
            log.warning("shutting down with %d unpublished messages", self.pending)
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), max(0.1, end - time.monotonic()))
            with contextlib.suppress(Exception):
                await self.nc.close()
