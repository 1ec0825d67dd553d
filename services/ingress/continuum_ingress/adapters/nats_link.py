"""The ingress process's one NATS connection, shared by everything in it that talks on the bus:
the KV routing component (indexer admin, listener heartbeats, the embedded index's feed,
routing decisions), the load reports between replicas and the Gemini context cache's client.

Nothing in the process listens for what it publishes itself (its decisions, tokenizations and
load reports are for the other replicas), so the connection asks the server not to echo them
back: without that, each would come back to this process, wake it and be decoded only to be
skipped.

The composition root (app.py) owns it as the first component, so it is closed last, after its
users. It connects in the background with the shared options of continuum_common.bus
(reconnect for ever, bounded pending buffer, credentials and TLS from `bus`): an ingress starts
and serves while NATS is down, and `connected` is set once the first connection is made
(nats-py reconnects by itself after that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client as NatsClient

from continuum_common.bus import connect_options
from continuum_common.config import RouterConfig
from continuum_common.config.router import Bus

log = logging.getLogger("continuum.ingress.nats")

CLIENT_NAME = "continuum-ingress"
DRAIN_TIMEOUT_S = 2.0


async def connect_client(nc: NatsClient, cfg: Bus, *, url: str | None, name: str) -> None:
    """Connect an existing client (nats-py retries the first connection for ever with the
    shared options; run this in a task and cancel it to give up)."""
    reported = False

    async def _error(exc: Exception) -> None:
        nonlocal reported
        if not reported:  # one warning per outage, not one per attempt
            log.warning("nats: %s (retrying in the background)", type(exc).__name__)
            reported = True

    async def _reconnected() -> None:
        nonlocal reported
        reported = False
        log.info("nats: reconnected")

    async def _noop() -> None:
        return None

    await nc.connect(
        **connect_options(cfg, url=url, name=name, no_echo=True),
        error_cb=_error,
        disconnected_cb=_noop,
        reconnected_cb=_reconnected,
    )


class NatsLink:
    """`nc` is usable once `connected` is set; until then its users treat the bus as down."""

    def __init__(self, cfg: Bus, *, url: str | None = None, name: str = CLIENT_NAME) -> None:
        self.nc = NatsClient()
        self.connected = asyncio.Event()
        self._cfg = cfg
        self._url = url
        self._name = name
        self._task: asyncio.Task[None] | None = None

    @property
    def is_connected(self) -> bool:
        return self.connected.is_set() and bool(self.nc.is_connected)

    async def start(self) -> None:
        """Start connecting; wait for the first connection up to `bus.connect_timeout_ms`, so the
        first requests after start find the bus (a Gemini cache miss must reach gemini-cache),
        then go on connecting in the background when NATS is not there yet."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._connect(), name="nats-connect")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), self._cfg.connect_timeout_ms / 1000)

    async def _connect(self) -> None:
        await connect_client(self.nc, self._cfg, url=self._url, name=self._name)
        log.info("ingress connected to NATS")
        self.connected.set()

    def reload(self, config: RouterConfig) -> None:
        """`bus` is restart-only: nothing to do."""

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.nc.is_connected:
            try:  # delivers what the users published last (final load report, usage)
                await asyncio.wait_for(self.nc.drain(), DRAIN_TIMEOUT_S)
            except Exception:
                with contextlib.suppress(Exception):
                    await self.nc.close()
        else:
            with contextlib.suppress(Exception):
                await self.nc.close()
