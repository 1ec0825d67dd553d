"""Routing decisions, and what `/tokenize` answered, to and from the other ingress replicas over
core NATS (continuum_common.wire.decisions: two subjects, one publishing queue).

Publishing never blocks a request: `offer()` / `offer_tokenized()` put the message in a bounded
queue that one task drains into the NATS client; when the queue is full (NATS slow or down) the
message is dropped and counted. Received messages from other replicas are handed to
`on_decision` / `on_tokenized` (without `on_tokenized` that subject is not subscribed);
undecodable ones are counted and dropped. This replica's own messages (NATS echoes them) are
recognised by their subject and skipped without decoding.

With `history` (kv/adapters/route_history.py) both subjects are also kept in a JetStream stream:
`run()` makes sure it exists, subscribes, and then, beside publishing, replays what the stream
held into `on_restored` (decisions, to be applied with their age, and tokenizations); `on_replayed`
is told how it ended (`done`, `timeout`, `failed`) and how many messages it handed on. What
other replicas publish while the replay starts arrives both ways and is handed on once
(kv/replay_overlap.py); `on_duplicate` is told of each copy skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from continuum_common.config.kv_index import RouteHistory
from continuum_common.wire.decisions import (
    SUBJECT_PREFIX,
    SUBJECT_WILDCARD,
    TOKENIZED_WILDCARD,
    Decision,
    DecisionDecodeError,
    Tokenized,
    decode_decision,
    decode_tokenized,
    encode_decision,
    encode_tokenized,
    subject_for,
    tokenized_subject_for,
)
from continuum_ingress.kv.adapters.route_history import ensure_history_stream, replay_history
from continuum_ingress.kv.replay_overlap import ReplayOverlap

log = logging.getLogger("continuum.ingress.kv")

QUEUE_SIZE = 4096

M = TypeVar("M", Decision, Tokenized)


class DecisionShare:
    def __init__(
        self,
        nc: NatsClient,
        replica: str,
        on_decision: Callable[[Decision], None],
        *,
        on_drop: Callable[[str], None] | None = None,
        on_tokenized: Callable[[Tokenized], None] | None = None,
        queue_size: int = QUEUE_SIZE,
        history: RouteHistory | None = None,
        history_replicas: int = 1,
        on_restored: Callable[[Decision | Tokenized], None] | None = None,
        on_replayed: Callable[[str, int], None] | None = None,
        on_duplicate: Callable[[], None] | None = None,
    ) -> None:
        self.nc = nc
        self.replica = replica
        self.subject = subject_for(replica)
        self.tokenized_subject = tokenized_subject_for(replica)
        self.on_decision = on_decision
        self.on_tokenized = on_tokenized
        self.on_drop = on_drop or (lambda reason: None)
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(queue_size)
        self._subs: list[Subscription] = []
        self.history = history if history is not None and history.enabled else None
        self.history_replicas = history_replicas
        self.on_restored = on_restored
        self.on_replayed = on_replayed or (lambda result, handed: None)
        self.on_duplicate = on_duplicate or (lambda: None)
        self.overlap = ReplayOverlap()
        self.sent = 0
        self.received = 0

    def offer(self, decision: Decision) -> None:
        self._put(self.subject, encode_decision, decision)

    def offer_tokenized(self, learnt: Tokenized) -> None:
        self._put(self.tokenized_subject, encode_tokenized, learnt)

    def _put(self, subject: str, encode: Callable[[Any], bytes], message: object) -> None:
        if not self.nc.is_connected:
            self.on_drop("bus_down")
            return
        try:
            self._queue.put_nowait((subject, encode(message)))
        except asyncio.QueueFull:
            self.on_drop("queue_full")

    async def run(self) -> None:
        """Subscribe, then publish queued messages until cancelled (NATS must be connected);
        with `history`, the stream's replay runs beside."""
        history = self.history is not None and await self._ensure_history()
        if history:  # before subscribing: what comes live from the first message on is remembered
            self.overlap.start()
        self._subs.append(await self.nc.subscribe(SUBJECT_WILDCARD, cb=self._received))
        if self.on_tokenized is not None:
            self._subs.append(await self.nc.subscribe(TOKENIZED_WILDCARD, cb=self._received_tokenized))
        try:
            async with asyncio.TaskGroup() as tasks:
                if history:
                    # the subscriptions are in place: the replay reads up to (a little past) where
                    # they begin, and the overlap hands what both deliver on once
                    await self.nc.flush()
                    tasks.create_task(self._replay())
                await self._publish()
        finally:
            for sub in self._subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _publish(self) -> None:
        while True:
            subject, payload = await self._queue.get()
            try:
                await self.nc.publish(subject, payload)
                self.sent += 1
            except Exception as exc:  # nats-py raises several types when disconnected
                self.on_drop("publish_failed")
                log.debug("decision not published: %s", type(exc).__name__)
            finally:
                self._queue.task_done()

    async def drain(self) -> None:
        """Until what is queued has been handed to NATS and the server has it (at shutdown,
        while `run()` still runs; the caller bounds the wait)."""
        await self._queue.join()
        await self.nc.flush()

    async def _ensure_history(self) -> bool:
        """Whether the history stream is there (created when missing); a refusal (no JetStream,
        no permission) leaves sharing as it is, without history."""
        assert self.history is not None
        try:
            async with asyncio.timeout(self.history.replay_timeout):
                await ensure_history_stream(self.nc.jetstream(), self.history, self.history_replicas)
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            log.warning("no route history: stream not available (%s)", type(exc).__name__)
            self.on_replayed("failed", 0)
            return False
        return True

    async def _replay(self) -> None:
        try:
            await self._replay_history()
        finally:
            self.overlap.done()

    async def _replay_history(self) -> None:
        assert self.history is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            handed = await replay_history(self.nc.jetstream(), self._restore, timeout_s=self.history.replay_timeout)
        except TimeoutError:
            log.warning("route history replay gave up after %.0f s", self.history.replay_timeout)
            self.on_replayed("timeout", 0)
            return
        except (nats.errors.Error, OSError) as exc:
            log.warning("route history replay failed (%s)", type(exc).__name__)
            self.on_replayed("failed", 0)
            return
        except Exception:  # never take the live sharing down with it
            log.exception("route history replay failed")
            self.on_replayed("failed", 0)
            return
        log.info("replayed %d shared routing messages in %.2f s", handed, loop.time() - started)
        self.on_replayed("done", handed)

    def _restore(self, subject: str, payload: bytes) -> None:
        """One message of the history, to `on_restored` (tokenizations only with `on_tokenized`,
        as live)."""
        if self.on_restored is None:
            return
        message: Decision | Tokenized | None
        if subject.startswith(SUBJECT_PREFIX):
            message = self._decode_payload(subject, payload, self.subject, decode_decision, replayed=True)
        elif self.on_tokenized is not None:
            message = self._decode_payload(subject, payload, self.tokenized_subject, decode_tokenized, replayed=True)
        else:
            return
        if message is not None:
            self.on_restored(message)

    async def _received(self, msg: Msg) -> None:
        decision = self._decode(msg, self.subject, decode_decision)
        if decision is not None:
            self.on_decision(decision)

    async def _received_tokenized(self, msg: Msg) -> None:
        learnt = self._decode(msg, self.tokenized_subject, decode_tokenized)
        if learnt is not None and self.on_tokenized is not None:
            self.on_tokenized(learnt)

    def _decode(self, msg: Msg, own_subject: str, decode: Callable[[bytes], M]) -> M | None:
        return self._decode_payload(msg.subject, msg.data, own_subject, decode)

    def _decode_payload(
        self, subject: str, data: bytes, own_subject: str, decode: Callable[[bytes], M], *, replayed: bool = False
    ) -> M | None:
        """Another replica's message, or None for our own echo, for a copy of one already handed
        on (live and replayed) and for what cannot be decoded (counted)."""
        if subject == own_subject:
            return None
        fresh = self.overlap.replayed(subject, data) if replayed else self.overlap.live(subject, data)
        if not fresh:
            self.on_duplicate()
            return None
        try:
            message = decode(data)
        except DecisionDecodeError:
            self.on_drop("decode")
            return None
        if message.replica == self.replica:
            return None
        self.received += 1
        return message
