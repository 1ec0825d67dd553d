"""Routing decisions to and from the other ingress replicas over core NATS
(continuum_common.wire.decisions).

Publishing never blocks a request: `offer()` puts the decision in a bounded queue that one task
drains into the NATS client; when the queue is full (NATS slow or down) the decision is dropped
and counted. Received decisions from other replicas are handed to `on_decision`; undecodable
ones are counted and dropped. This replica's own messages (NATS echoes them) are recognised by
their subject and skipped without decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from continuum_common.wire.decisions import (
    SUBJECT_WILDCARD,
    Decision,
    DecisionDecodeError,
    decode_decision,
    encode_decision,
    subject_for,
)

log = logging.getLogger("continuum.ingress.kv")

QUEUE_SIZE = 4096


class DecisionShare:
    def __init__(
        self,
        nc: NatsClient,
        replica: str,
        on_decision: Callable[[Decision], None],
        *,
        on_drop: Callable[[str], None] | None = None,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.nc = nc
        self.replica = replica
        self.subject = subject_for(replica)
        self.on_decision = on_decision
        self.on_drop = on_drop or (lambda reason: None)
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(queue_size)
        self._sub: Subscription | None = None
        self.sent = 0
        self.received = 0

    def offer(self, decision: Decision) -> None:
        if not self.nc.is_connected:
            self.on_drop("bus_down")
            return
        try:
            self._queue.put_nowait(encode_decision(decision))
        except asyncio.QueueFull:
            self.on_drop("queue_full")

    async def run(self) -> None:
        """Subscribe, then publish queued decisions until cancelled (NATS must be connected)."""
        self._sub = await self.nc.subscribe(SUBJECT_WILDCARD, cb=self._received)
        try:
            while True:
                payload = await self._queue.get()
                try:
                    await self.nc.publish(self.subject, payload)
                    self.sent += 1
                except Exception as exc:  # nats-py raises several types when disconnected
                    self.on_drop("publish_failed")
                    log.debug("decision not published: %s", type(exc).__name__)
        finally:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _received(self, msg: Msg) -> None:
        if msg.subject == self.subject:
            return
        try:
            decision = decode_decision(msg.data)
        except DecisionDecodeError:
            self.on_drop("decode")
            return
        if decision.replica == self.replica:
            return
        self.received += 1
        self.on_decision(decision)
