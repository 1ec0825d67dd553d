"""The JetStream pull consumer: fetch a batch, apply it, ack after the index write succeeded.

* Durable (shared by every indexer replica: JetStream hands each message to one of them) or,
  for the embedded memory mode, private and ephemeral, replaying the recent stream on start.
* Explicit acks, `max_ack_pending` bounds what is in flight, unlimited redelivery. The private
  consumer of an embedded in-memory index acks nothing (`acks=False`, AckPolicy NONE): its
  writes cannot fail, it dies with its process, and an ack per message was one more NATS message
  each way for every bus message (the pull requests still bound what is delivered).
* A message is a version-1 prefix-key event (prefix index) or a version-2 KV batch (block
  index); a fetched batch's KV batches are applied together (one script call per backend),
  in writes of at most `block_write_events` block events, each acked once written.
* Undecodable messages are counted, logged without their payload and terminated (never
  redelivered, never blocking the stream). Version-1 events of backends configured for the
  SSE transport are acked and skipped (one transport per backend; blocks only come by bus).
* An index failure naks the messages of that index's write with a delay and backs off
  exponentially; the redelivered events and batches are applied idempotently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, BadRequestError, FetchTimeoutError
from opentelemetry import trace
from prometheus_client import Gauge

from continuum_common.backoff import Backoff
from continuum_common.events import STREAM_NAME, SUBJECT_WILDCARD, KvEvent
from continuum_common.kvindex import KvIndexError
from continuum_common.kvindex.block_pack import batch_blocks, split_by_size
from continuum_common.tracing import Tracing
from continuum_common.wire.indexer_admin import SourceStats
from continuum_common.wire.kv import KvBatch
from continuum_indexer.adapters.pull import ConsumerGoneError, PullStream
from continuum_indexer.config import ConsumerSettings
from continuum_indexer.errors import DroppedEvent
from continuum_indexer.event_sink import EventSink
from continuum_indexer.metrics import EVENT_BUS_SOURCE
from continuum_indexer.protocol.bus_messages import decode_bus_message

log = logging.getLogger("continuum.indexer.jetstream")
_IDLE_ERRORS = (nats.errors.TimeoutError, FetchTimeoutError, asyncio.TimeoutError)


MAX_SPAN_LINKS = 128  # links per apply span (a write can carry thousands of messages)


class JetStreamConsumer:
    def __init__(
        self,
        nc: NatsClient,
        sink: EventSink,
        settings: ConsumerSettings,
        *,
        skip_backends: frozenset[str] = frozenset(),
        prepare: Callable[[], Awaitable[None]] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.nc = nc
        # With tracing on, each index write is a CONSUMER span linked to the listener's span of
        # every message it applies (their `traceparent` headers).
        self.tracing = tracing if tracing is not None and tracing.enabled else None
        self.js = nc.jetstream()
        self.sink = sink
        self.settings = settings
        self.skip_backends = skip_backends
        self.prepare = prepare  # run before every bind (the app makes sure the stream exists)
        self._ever_connected = False
        self.stats = SourceStats(EVENT_BUS_SOURCE, "event_bus")
        self.ready = asyncio.Event()  # set once the consumer is bound
        self._stopping = False
        self._puller: PullStream | None = None  # while consuming: stop() wakes its wait
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
        # Redis runs scripts one at a time: more writes in flight than this only queue there,
        # on the clock of the command timeout, instead of here
        self._block_writes = asyncio.Semaphore(settings.block_writes_in_flight)

    async def report_pending(self, gauge: Gauge) -> None:
        """Set `gauge` to the durable consumer's backlog (pending + unacknowledged); left as it
        was when JetStream does not answer within a second (an embedded private consumer has
        no durable to ask about)."""
        durable = self.settings.durable
        if durable is None or not self.nc.is_connected:
            return
        try:
            info = await self.js.consumer_info(STREAM_NAME, durable, timeout=1.0)
        except (nats.errors.Error, TimeoutError, OSError):
            return
        gauge.set((info.num_pending or 0) + (info.num_ack_pending or 0))

    def stop(self) -> None:
        """Finish the batch in hand (apply + ack), then return from run(). A pull waiting for
        the next message returns at once instead of at the end of `idle_wait_s`."""
        self._stopping = True
        if self._puller is not None:
            self._puller.wake()

    def _consumer_config(self) -> ConsumerConfig:
        s = self.settings
        config = ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=s.ack_wait_s,
            max_ack_pending=s.max_ack_pending,
            max_deliver=-1,
            filter_subject=SUBJECT_WILDCARD,
            deliver_policy=DeliverPolicy.ALL,
        )
        if not s.acks:
            config.ack_policy = AckPolicy.NONE
            config.ack_wait = config.max_ack_pending = config.max_deliver = None
        if s.durable is None:
            # private consumer of an embedded process: gone a minute after the process is
            config.inactive_threshold = 60.0
            if s.replay_seconds is not None:
                config.deliver_policy = DeliverPolicy.BY_START_TIME
                config.opt_start_time = datetime.now(UTC) - timedelta(seconds=s.replay_seconds)
        return config

    async def _subscribe(self) -> Any:
        durable = self.settings.durable
        for attempt in range(2):
            try:
                return await self.js.pull_subscribe(
                    SUBJECT_WILDCARD, durable=durable, stream=STREAM_NAME, config=self._consumer_config()
                )
            except BadRequestError:
                # another replica created the durable between our lookup and our create
                if attempt or durable is None:
                    raise
        raise AssertionError("unreachable")

    async def run(self) -> None:
        """Bind (creating the durable if needed), consume until stop(); when the consumer or
        the stream disappears (deleted by an operator), bind again."""
        while not self._stopping:
            sub = await self._bind()
            if sub is None:
                return
            try:
                await self._consume(sub)
            except ConsumerGoneError as exc:
                delay = self._backoff.next()
                log.warning("consumer gone (%s); binding again in %.1fs", exc.description or exc.code, delay)
                await asyncio.sleep(delay)
            finally:
                self._set_connected(False)
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _bind(self) -> Any:
        while not self._stopping:
            try:
                if self.prepare is not None:
                    await self.prepare()
                sub = await self._subscribe()
            except (APIError, nats.errors.Error, OSError, *_IDLE_ERRORS) as exc:
                delay = self._backoff.next()
                log.warning(
                    "cannot bind consumer on %s (%s); retrying in %.1fs", STREAM_NAME, type(exc).__name__, delay
                )
                await asyncio.sleep(delay)
                continue
            self._backoff.reset()
            self.ready.set()
            log.info("consuming %s as %s", STREAM_NAME, self.settings.durable or "an ephemeral consumer")
            return sub
        return None

    async def _consume(self, sub: Any) -> None:
        puller = self._puller = PullStream(sub, batch=self.settings.batch)
        # Up to `concurrency` batches are applied at once, so the next batch is pulled and
        # decoded while Redis runs the previous one's scripts (order does not matter: see
        # continuum_common.kvindex.entry).
        slots = asyncio.Semaphore(self.settings.concurrency)
        gone: ConsumerGoneError | None = None
        async with asyncio.TaskGroup() as tg:  # waits for the batches in hand before leaving
            while not self._stopping:
                self._set_connected(self.nc.is_connected)
                await slots.acquire()
                try:
                    msgs = await puller.next_batch(self.settings.idle_wait_s)
                except ConsumerGoneError as exc:
                    slots.release()
                    gone = exc
                    break
                except (nats.errors.Error, APIError, OSError) as exc:
                    slots.release()
                    self._set_connected(False)
                    delay = self._backoff.next()
                    log.warning("pull failed (%s); retrying in %.1fs", type(exc).__name__, delay)
                    await asyncio.sleep(delay)
                    continue
                if not msgs:
                    slots.release()
                    continue
                tg.create_task(self._handle_in_slot(msgs, slots))
        if gone is not None:
            raise gone
        for msg in puller.leftovers():
            await self._settle(msg, "nak")

    async def _handle_in_slot(self, msgs: list[Msg], slots: asyncio.Semaphore) -> None:
        try:
            await self.handle(msgs)
        finally:
            slots.release()

    def _set_connected(self, connected: bool) -> None:
        if connected and not self.stats.connected and self._ever_connected:
            self.stats.reconnect_count += 1
            self.sink.metrics.reconnects.labels(EVENT_BUS_SOURCE).inc()
        self._ever_connected = self._ever_connected or connected
        self.stats.connected = connected
        self.sink.metrics.connected.labels(EVENT_BUS_SOURCE).set(1 if connected else 0)

    async def handle(self, msgs: list[Msg]) -> None:
        """Decode, apply and settle one fetched batch: version-1 events into the prefix index,
        version-2 batches (grouped per backend by the block index) into the block index. Each
        part is acked after its own write; a part whose write failed is nak'd with backoff."""
        events: list[KvEvent] = []
        event_msgs: list[Msg] = []
        batches: list[KvBatch] = []
        batch_msgs: list[Msg] = []
        for msg in msgs:
            try:
                item = decode_bus_message(msg.subject, msg.data)
            except DroppedEvent as drop:
                self._drop(msg, drop)
                await self._settle(msg, "term")
                continue
            if isinstance(item, KvBatch):
                # SSE sources carry prefix-key events only: blocks always come from the bus
                batches.append(item)
                batch_msgs.append(msg)
            elif item.backend in self.skip_backends:
                self.sink.dropped(item.backend, "not_bus_source")
                await self._settle(msg, "ack")
            else:
                events.append(item)
                event_msgs.append(msg)
        self.stats.saw_events(len(msgs))
        failed: list[Msg] = []
        if events:
            self.sink.received_batch(events, "event_bus")
            if not await self._write(lambda: self.sink.apply(events), event_msgs, "events"):
                failed += event_msgs
        if batches:
            self.sink.received_blocks(batches)
            failed += await self._write_blocks(batches, batch_msgs)
        if not failed:
            if events or batches:
                self._backoff.reset()
            return
        delay = self._backoff.next()
        if not self.settings.acks:  # nothing redelivers them: count them as lost
            self.sink.dropped(None, "write_failed", len(failed))
        for msg in failed:
            await self._settle(msg, "nak", delay)
        await asyncio.sleep(delay)

    async def _write_blocks(self, batches: list[KvBatch], msgs: list[Msg]) -> list[Msg]:
        """Apply the KV batches in writes of at most `block_write_events` block events (a
        backlog's pull holds hundreds of thousands: each write stays well within the Redis
        command timeout, and a failure redelivers only what was not written); return the
        messages left unwritten."""
        start = 0
        for part in split_by_size(batches, self.settings.block_write_events, batch_blocks):
            end = start + len(part)
            async with self._block_writes:
                written = await self._write(partial(self.sink.apply_blocks, part), msgs[start:end], "block batches")
            if not written:
                return msgs[start:]
            start = end
        return []

    async def _write(self, write: Callable[[], Awaitable[object]], msgs: list[Msg], what: str) -> bool:
        """Run one index write; ack its messages when it succeeded."""
        try:
            if self.tracing is None:
                await write()
            else:
                await self._traced(self.tracing, write, msgs, what)
        except KvIndexError as exc:
            fate = "naked" if self.settings.acks else "lost"
            log.warning("index write failed (%s); %d %s %s", exc, len(msgs), what, fate)
            return False
        for msg in msgs:
            await self._settle(msg, "ack")
        return True

    @staticmethod
    async def _traced(tracing: Tracing, write: Callable[[], Awaitable[object]], msgs: list[Msg], what: str) -> None:
        links = []
        for msg in msgs[:MAX_SPAN_LINKS]:
            context = trace.get_current_span(tracing.extract(msg.headers)).get_span_context()
            if context.is_valid:
                links.append(trace.Link(context))
        attributes: dict[str, str | int] = {"messaging.system": "nats", "messaging.batch.message_count": len(msgs)}
        with tracing.tracer.start_as_current_span(
            f"kv.apply {what}", kind=trace.SpanKind.CONSUMER, links=links, attributes=attributes
        ):
            await write()

    def _drop(self, msg: Msg, drop: DroppedEvent) -> None:
        self.stats.events_dropped += 1
        self.sink.dropped(drop.backend, drop.reason)
        meta = msg.metadata
        # never the payload: only where it sat in the stream and why it was refused
        log.warning(
            "dropped bus event (%s) stream_seq=%s subject=%s size=%d: %s",
            drop.reason,
            meta.sequence.stream if meta and meta.sequence else "?",
            msg.subject[:120],
            len(msg.data),
            drop,
        )

    async def _settle(self, msg: Msg, how: Literal["ack", "nak", "term"], delay: float | None = None) -> None:
        """Ack/nak/term are fire-and-forget publishes; a lost one means a redelivery, which
        the index absorbs, so a failure here is logged, not raised. Nothing is sent by a
        consumer that acks nothing."""
        if not self.settings.acks:
            return
        try:
            if how == "ack":
                await msg.ack()
            elif how == "nak":
                await msg.nak(delay=delay)
            else:
                await msg.term()
        except (nats.errors.Error, OSError) as exc:
            log.debug("could not settle a message: %s", type(exc).__name__)
