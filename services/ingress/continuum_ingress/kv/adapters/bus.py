"""The ingress's NATS I/O for Tier 4 (on the process's one connection,
continuum_ingress.adapters.nats_link): the indexer's admin request/reply
(`continuum.indexer.admin.<verb>`) and the listener heartbeats (KV bucket
`continuum_listeners`). Every call is bounded by `bus.request_timeout_ms`; a failure returns
None / [] and is logged, never raised into an admin request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient

from continuum_common.events import LISTENERS_BUCKET
from continuum_common.wire import indexer_admin

log = logging.getLogger("continuum.ingress.kv")

MAX_HEARTBEATS = 4096


class BusReader:
    def __init__(self, nc: NatsClient, timeout_s: float) -> None:
        self.nc = nc
        self.timeout_s = timeout_s

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def indexer(self, verb: str) -> dict[str, Any] | None:
        """One indexer replica's answer to an admin verb, or None (no indexer, NATS down)."""
        if not self.connected:
            return None
        try:
            msg = await self.nc.request(
                indexer_admin.subject_for(verb), indexer_admin.REQUEST_BODY, timeout=self.timeout_s
            )
            return indexer_admin.decode_reply(msg.data)
        except Exception as exc:  # no responders, timeout, a broken answer
            log.info("indexer admin %s: no answer (%s)", verb, type(exc).__name__)
            return None

    async def heartbeats(self) -> list[dict[str, Any]]:
        """The live listener heartbeats (one per backend; entries expire with the bucket TTL)."""
        if not self.connected:
            return []
        out: list[dict[str, Any]] = []
        watcher: Any = None
        try:
            async with asyncio.timeout(self.timeout_s):
                kv = await self.nc.jetstream().key_value(LISTENERS_BUCKET)
                watcher = await kv.watchall(ignore_deletes=True)
                async for entry in watcher:
                    if entry is None or len(out) >= MAX_HEARTBEATS:
                        break  # None marks the end of the current values
                    value = orjson.loads(entry.value or b"null")
                    if isinstance(value, dict):
                        out.append(value)
        except Exception as exc:  # no bucket yet (no listener ever ran), timeout, bad value
            log.debug("listener heartbeats: %s", type(exc).__name__)
        finally:
            if watcher is not None:
                with contextlib.suppress(Exception):
                    await watcher.stop()
        return out
