"""The ingress's NATS client of the gemini-cache service (continuum_common.wire.gemini).

* `lookup`: request/reply with the configured short timeout; a timeout, "no responders", a
  closed connection or a malformed reply is `None` (the caller treats it as a miss), counted by
  reason.
* `ensure`, `drop`: fire-and-forget publishes through one bounded queue drained by one task, so
  the request path never waits on the bus; a full queue is a counted drop.
* `send_usage`: the usage report (about one a second, from the context cache's own task) as a
  request the service acknowledges. A report nobody acknowledged - no gemini-cache service
  running ("no responders"), no answer in time, NATS down - is counted as dropped with its
  reason, and the requests it carried in `usage_lost_requests`, because the fleet-wide counts in
  the service's stats will lack them.
* `stats`, `clear`: admin request/reply (ADMIN_TIMEOUT_S).

The connection is the ingress process's one NATS connection (continuum_ingress.adapters.
nats_link), made in the background by its owner: until it is up, every lookup is a miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient

from continuum_common.config.router import Bus
from continuum_common.wire.gemini import (
    ADMIN_TIMEOUT_S,
    SUBJECT_ADMIN_CLEAR,
    SUBJECT_ADMIN_STATS,
    SUBJECT_LOOKUP,
    SUBJECT_USAGE,
    ClearReply,
    GeminiProtocolError,
    LookupReply,
    LookupRequest,
    UsageReport,
    decode_stats,
)
from continuum_ingress.adapters.nats_link import NatsLink
from continuum_ingress.gemini.errors import GeminiIngressError
from continuum_ingress.gemini.metrics import GeminiMetrics

log = logging.getLogger(__name__)

PUBLISH_QUEUE = 4096
DEFAULT_MAX_PAYLOAD = 1024 * 1024
# "No responders" can be a moment's gap in interest while a service (re)subscribes: a report
# nobody received is safe to send again, so it is, this many times, before it counts as lost.
USAGE_ATTEMPTS = 3
USAGE_RETRY_S = 0.02


class ServiceUnavailable(GeminiIngressError):
    """The gemini-cache service did not answer an admin request."""


class GeminiBus:
    def __init__(self, cfg: Bus, metrics: GeminiMetrics, *, link: NatsLink, lookup_timeout_s: float) -> None:
        self._cfg = cfg
        self._link = link
        self._metrics = metrics
        self._lookup_timeout = lookup_timeout_s
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(PUBLISH_QUEUE)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def _nc(self) -> NatsClient | None:
        """The shared connection once it was made (nats-py reconnects it by itself)."""
        return self._link.nc if self._link.connected.is_set() else None

    @property
    def connected(self) -> bool:
        return self._link.is_connected

    @property
    def max_payload(self) -> int:
        return self._nc.max_payload if self._nc is not None else DEFAULT_MAX_PAYLOAD

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._publisher(), name="gemini-bus-publish"))

    async def aclose(self) -> None:
        await self.flush_pending()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()  # the connection is closed by its owner, after this

    # ------------------------------------------------------------------ lookups

    async def lookup(self, request: LookupRequest) -> LookupReply | None:
        nc = self._nc
        if nc is None or not nc.is_connected:
            self._metrics.lookup_failure("not_connected")
            return None
        try:
            with self._metrics.lookup_seconds.time():
                msg = await nc.request(SUBJECT_LOOKUP, request.to_bytes(), timeout=self._lookup_timeout)
            return LookupReply.from_bytes(msg.data)
        except TimeoutError:
            self._metrics.lookup_failure("timeout")
        except nats.errors.NoRespondersError:
            self._metrics.lookup_failure("no_responders")
        except GeminiProtocolError:
            self._metrics.lookup_failure("bad_reply")
        except Exception as exc:  # closed or draining connection, slow consumer...
            self._metrics.lookup_failure("error")
            log.debug("gemini-cache lookup failed: %s", type(exc).__name__)
        return None

    # ------------------------------------------------------------------ publishes

    def publish(self, subject: str, data: bytes, kind: str) -> bool:
        """Queue a publish; False (and a counted drop) when it cannot go out."""
        if self._nc is None:
            self._metrics.dropped(kind, "not_connected")
            return False
        if len(data) > self.max_payload:
            self._metrics.dropped(kind, "too_large")
            return False
        try:
            self._queue.put_nowait((subject, data))
        except asyncio.QueueFull:
            self._metrics.dropped(kind, "queue_full")
            return False
        return True

    async def _publisher(self) -> None:
        while True:
            subject, data = await self._queue.get()
            await self._send(subject, data)

    async def _send(self, subject: str, data: bytes) -> None:
        nc = self._nc
        try:
            if nc is None:
                raise ConnectionError("not connected")
            await nc.publish(subject, data)
        except Exception as exc:
            self._metrics.dropped(subject.rsplit(".", 1)[-1], "publish_failed")
            log.debug("gemini-cache publish failed: %s", type(exc).__name__)

    async def flush_pending(self) -> None:
        """Send what is queued now and flush the connection (before an admin request, and at
        shutdown, so this replica's latest usage counts are in the answer)."""
        while not self._queue.empty():
            subject, data = self._queue.get_nowait()
            await self._send(subject, data)
        if self._nc is not None and self._nc.is_connected:
            with contextlib.suppress(Exception):
                await self._nc.flush(timeout=2)

    async def send_usage(self, report: UsageReport) -> bool:
        """Send one usage report and wait for the acknowledgement (at most
        `bus.request_timeout_ms`); False, with the loss counted, when none came."""
        # Stays "timeout" if shutdown cancels the wait: nobody will send this report again.
        reason: str | None = "timeout"
        try:
            reason = await self._deliver_usage(report.to_bytes())
        finally:
            if reason is not None:
                self._metrics.dropped("usage", reason)
                self._metrics.usage_lost_requests.inc(report.requests())
        return reason is None

    async def _deliver_usage(self, data: bytes) -> str | None:
        """None once acknowledged, else why the report is lost."""
        reason = "not_connected"
        for attempt in range(USAGE_ATTEMPTS):
            nc = self._nc
            if nc is None or not nc.is_connected:
                return "not_connected"
            if len(data) > self.max_payload:
                return "too_large"
            try:
                await nc.request(SUBJECT_USAGE, data, timeout=self._cfg.request_timeout_ms / 1000)
                return None
            except nats.errors.NoRespondersError:
                reason = "no_responders"
                if attempt + 1 < USAGE_ATTEMPTS:
                    await asyncio.sleep(USAGE_RETRY_S)
            except TimeoutError:
                return "timeout"  # it may have been counted: not sent again
            except Exception as exc:  # closed or draining connection
                log.debug("gemini-cache usage report failed: %s", type(exc).__name__)
                return "publish_failed"
        return reason

    # ------------------------------------------------------------------ admin

    async def _admin(self, subject: str) -> bytes:
        nc = self._nc
        if nc is None or not nc.is_connected:
            raise ServiceUnavailable("the ingress is not connected to the bus")
        try:
            msg = await nc.request(subject, b"{}", timeout=ADMIN_TIMEOUT_S)
        except TimeoutError:
            raise ServiceUnavailable("the gemini-cache service did not answer in time") from None
        except nats.errors.NoRespondersError:
            raise ServiceUnavailable("no gemini-cache service is running") from None
        except Exception as exc:
            raise ServiceUnavailable(f"the bus request failed ({type(exc).__name__})") from None
        data: bytes = msg.data
        return data

    async def stats(self) -> dict[str, Any]:
        await self.flush_pending()
        data = await self._admin(SUBJECT_ADMIN_STATS)
        try:
            return decode_stats(data)
        except GeminiProtocolError:
            raise ServiceUnavailable("the gemini-cache service sent an unreadable answer") from None

    async def clear(self) -> ClearReply:
        data = await self._admin(SUBJECT_ADMIN_CLEAR)
        try:
            return ClearReply.from_bytes(data)
        except GeminiProtocolError:
            raise ServiceUnavailable("the gemini-cache service sent an unreadable answer") from None
