"""Load reports between ingress replicas over core NATS (continuum_common.wire.loads): each
replica publishes on `continuum.ingress.load.<replica>` and subscribes to
`continuum.ingress.load.*`, skipping its own subject without decoding it.

The connection is the ingress process's one NATS connection (adapters/nats_link.py, made in
the background; this transport waits for it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from continuum_common.wire.loads import SUBJECT_WILDCARD, subject_for
from continuum_ingress.load_transport import Delivery

log = logging.getLogger("continuum.ingress.load")

FLUSH_TIMEOUT_S = 1  # whole seconds (nats-py)


class NatsLoadTransport:
    name = "nats"

    def __init__(
        self,
        nc: NatsClient,
        replica: str,
        *,
        connect: Callable[[], Awaitable[object]] | None = None,
        owns_connection: bool = False,
    ) -> None:
        """`connect`: returns once `nc` is connected (makes the connection when the transport
        owns it, else waits for its owner's)."""
        self.nc = nc
        self.subject = subject_for(replica)
        self._connect = connect
        self._owns = owns_connection
        self._sub: Subscription | None = None
        self._receive: Callable[[bytes], None] | None = None

    @property
    def connected(self) -> bool:
        return self._sub is not None and bool(self.nc.is_connected)

    async def open(self, receive: Callable[[bytes], None]) -> None:
        if self._connect is not None:
            await self._connect()
        self._receive = receive
        self._sub = await self.nc.subscribe(SUBJECT_WILDCARD, cb=self._received)

    async def publish(self, payload: bytes) -> Delivery:
        if not self.connected:
            return Delivery(dropped=("bus_down",))
        try:
            await self.nc.publish(self.subject, payload)
        except Exception as exc:  # nats-py raises several types when disconnected
            log.debug("load report not published: %s", type(exc).__name__)
            return Delivery(dropped=("publish_failed",))
        return Delivery(sent=1)

    async def flush(self) -> None:
        await self.nc.flush(timeout=FLUSH_TIMEOUT_S)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._owns:
            with contextlib.suppress(Exception):
                await self.nc.close()

    async def _received(self, msg: Msg) -> None:
        if msg.subject == self.subject or self._receive is None:
            return
        self._receive(msg.data)
