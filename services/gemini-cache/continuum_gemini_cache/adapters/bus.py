"""NATS side of the service: the subjects of continuum_common.wire.gemini, each in the queue
group `continuum-gemini-cache` so replicas share the work. Malformed messages are counted and
dropped (with a harmless reply when the sender waits for one); work beyond the concurrency bound
is answered at once (a lookup as a miss) and counted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from continuum_common.wire.gemini import (
    QUEUE_GROUP,
    SUBJECT_ADMIN_CLEAR,
    SUBJECT_ADMIN_STATS,
    SUBJECT_DROP,
    SUBJECT_ENSURE,
    SUBJECT_LOOKUP,
    SUBJECT_USAGE,
    DropReply,
    DropRequest,
    EnsureRequest,
    GeminiProtocolError,
    LookupReply,
    LookupRequest,
    LookupResult,
    UsageReport,
)
from continuum_gemini_cache.config import Limits
from continuum_gemini_cache.metrics import Metrics
from continuum_gemini_cache.service import GeminiCacheService

log = logging.getLogger("continuum.gemini_cache.bus")

_MISS = LookupReply(LookupResult.MISS).to_bytes()
# Per-subscription buffers inside nats-py (bounded; overflow is a slow-consumer drop).
_PENDING_MSGS = 20_000
_PENDING_BYTES = 64 * 1024 * 1024


class BusAdapter:
    def __init__(self, nc: NatsClient, service: GeminiCacheService, metrics: Metrics, limits: Limits) -> None:
        self._nc = nc
        self._service = service
        self._metrics = metrics
        self._limit = limits.concurrent_requests
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._bad_logged_at = -1e9
        self._bad_since_log = 0

    async def start(self) -> None:
        handlers: list[tuple[str, Callable[[Msg], Awaitable[None]]]] = [
            (SUBJECT_LOOKUP, self._on_lookup),
            (SUBJECT_ENSURE, self._on_ensure),
            (SUBJECT_DROP, self._on_drop),
            (SUBJECT_USAGE, self._on_usage),
            (SUBJECT_ADMIN_STATS, self._on_stats),
            (SUBJECT_ADMIN_CLEAR, self._on_clear),
        ]
        for subject, cb in handlers:
            sub = await self._nc.subscribe(
                subject,
                queue=QUEUE_GROUP,
                cb=cb,
                pending_msgs_limit=_PENDING_MSGS,
                pending_bytes_limit=_PENDING_BYTES,
            )
            self._subs.append(sub)
        await self._nc.flush(timeout=5)

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=5)
            for task in pending:
                task.cancel()

    # ------------------------------------------------------------------ plumbing

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> bool:
        if len(self._tasks) >= self._limit:
            coro.close()
            self._metrics.dropped.labels("overloaded").inc()
            return False
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _respond(self, msg: Msg, data: bytes) -> None:
        if msg.reply:
            try:
                await msg.respond(data)
            except Exception as exc:  # the requester went away or the connection dropped
                log.debug("reply failed: %s", type(exc).__name__)

    def _bad(self, msg: Msg, exc: GeminiProtocolError) -> None:
        self._metrics.dropped.labels("bad_message").inc()
        self._bad_since_log += 1
        now = time.monotonic()
        if now - self._bad_logged_at >= 10:  # a flood of bad input must not flood the log
            log.warning("dropped %d malformed message(s); latest on %s: %s", self._bad_since_log, msg.subject, exc)
            self._bad_logged_at, self._bad_since_log = now, 0

    # ------------------------------------------------------------------ handlers

    async def _on_lookup(self, msg: Msg) -> None:
        try:
            req = LookupRequest.from_bytes(msg.data)
        except GeminiProtocolError as exc:
            self._bad(msg, exc)
            await self._respond(msg, _MISS)
            return

        async def run() -> None:
            reply = await self._service.lookup(req)
            await self._respond(msg, reply.to_bytes())

        if not self._spawn(run()):
            await self._respond(msg, _MISS)

    async def _on_ensure(self, msg: Msg) -> None:
        try:
            req = EnsureRequest.from_bytes(msg.data)
        except GeminiProtocolError as exc:
            self._bad(msg, exc)
            return
        future = self._service.submit_ensure(req)
        if not msg.reply:
            return

        async def answer() -> None:
            reply = await asyncio.shield(future)
            await self._respond(msg, reply.to_bytes())

        self._spawn(answer())

    async def _on_drop(self, msg: Msg) -> None:
        try:
            req = DropRequest.from_bytes(msg.data)
        except GeminiProtocolError as exc:
            self._bad(msg, exc)
            await self._respond(msg, DropReply(False).to_bytes())
            return

        async def run() -> None:
            reply = await self._service.drop(req)
            await self._respond(msg, reply.to_bytes())

        self._spawn(run())

    async def _on_usage(self, msg: Msg) -> None:
        # The acknowledgement tells the ingress its report arrived; a malformed one is counted
        # here and acknowledged too (resending it would not make it readable).
        try:
            report = UsageReport.from_bytes(msg.data)
        except GeminiProtocolError as exc:
            self._bad(msg, exc)
        else:
            self._service.record_usage(report)
        await self._respond(msg, b"{}")

    async def _on_stats(self, msg: Msg) -> None:
        async def run() -> None:
            stats = await self._service.stats()
            await self._respond(msg, orjson.dumps(stats))

        self._spawn(run())

    async def _on_clear(self, msg: Msg) -> None:
        async def run() -> None:
            reply = await self._service.clear()
            await self._respond(msg, reply.to_bytes())

        self._spawn(run())
