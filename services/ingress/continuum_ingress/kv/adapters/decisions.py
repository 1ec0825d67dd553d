"""Routing decisions, and what `/tokenize` answered, to and from the other ingress replicas over
core NATS (continuum_common.wire.decisions: two subjects, one publishing queue).

Publishing never blocks a request: `offer()` / `offer_tokenized()` put the message in a bounded
queue that one task drains into the NATS client; when the queue is full (NATS slow or down) the
message is dropped and counted. Received messages from other replicas are handed to
`on_decision` / `on_tokenized` (without `on_tokenized` that subject is not subscribed);
undecodable ones are counted and dropped. This replica's own messages (NATS echoes them) are
recognised by their subject and skipped without decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from continuum_common.wire.decisions import (
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
        """Subscribe, then publish queued messages until cancelled (NATS must be connected)."""
        self._subs.append(await self.nc.subscribe(SUBJECT_WILDCARD, cb=self._received))
        if self.on_tokenized is not None:
            self._subs.append(await self.nc.subscribe(TOKENIZED_WILDCARD, cb=self._received_tokenized))
        try:
            while True:
                subject, payload = await self._queue.get()
                try:
                    await self.nc.publish(subject, payload)
                    self.sent += 1
                except Exception as exc:  # nats-py raises several types when disconnected
                    self.on_drop("publish_failed")
                    log.debug("decision not published: %s", type(exc).__name__)
        finally:
            for sub in self._subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _received(self, msg: Msg) -> None:
        decision = self._decode(msg, self.subject, decode_decision)
        if decision is not None:
            self.on_decision(decision)

    async def _received_tokenized(self, msg: Msg) -> None:
        learnt = self._decode(msg, self.tokenized_subject, decode_tokenized)
        if learnt is not None and self.on_tokenized is not None:
            self.on_tokenized(learnt)

    def _decode(self, msg: Msg, own_subject: str, decode: Callable[[bytes], M]) -> M | None:
        """Another replica's message, or None for our own echo and for what cannot be decoded
        (counted)."""
        if msg.subject == own_subject:
            return None
        try:
            message = decode(msg.data)
        except DecisionDecodeError:
            self.on_drop("decode")
            return None
        if message.replica == self.replica:
            return None
        self.received += 1
        return message
