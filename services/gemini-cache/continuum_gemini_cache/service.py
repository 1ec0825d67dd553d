"""The gemini-cache core: answers lookups, runs single-flight creates, records negative
entries, evicts over max_entries, extends on hit, drops stale references, serves admin stats
and clear. Transport-free: the bus adapter calls these methods; the app wires them up."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from continuum_common.logs import short_hash
from continuum_common.wire.gemini import (
    ClearReply,
    DropReply,
    DropRequest,
    EnsureOutcome,
    EnsureReply,
    EnsureRequest,
    LookupReply,
    LookupRequest,
    LookupResult,
    RequestOutcome,
    UsageReport,
    entry_id,
)
from continuum_gemini_cache.adapters.google_api import GoogleCacheApi
from continuum_gemini_cache.config import Settings
from continuum_gemini_cache.errors import StateError
from continuum_gemini_cache.maintenance import Maintenance
from continuum_gemini_cache.metrics import Metrics
from continuum_gemini_cache.model import Entry, Found, NegativeEntry
from continuum_gemini_cache.policy import classify_create_failure, ineligible_reason, should_extend
from continuum_gemini_cache.stats import StatsTally, build_stats
from continuum_gemini_cache.store import Store

log = logging.getLogger("continuum.gemini_cache")


@dataclass(slots=True)
class _EnsureJob:
    req: EnsureRequest
    future: asyncio.Future[EnsureReply]


class GeminiCacheService:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        google: GoogleCacheApi,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.google = google
        self.metrics = metrics
        self.clock = clock
        limits = settings.limits
        self.tally = StatsTally(store, metrics)
        self.maintenance = Maintenance(settings, store, google, metrics, self.tally, clock=clock)
        self._ensure_q: asyncio.Queue[_EnsureJob] = asyncio.Queue(maxsize=limits.ensure_queue)
        # ids queued or being created on this replica (the in-process half of single-flight)
        self._active: set[str] = set()
        self._store_warned_at = -1e9

    def _store_failed(self, op: str) -> None:
        """Count a state-store failure; log at most one warning per 10 s (an outage would
        otherwise log once per request)."""
        self.metrics.store_errors.labels(op).inc()
        now = time.monotonic()
        if now - self._store_warned_at >= 10:
            self._store_warned_at = now
            log.warning("state store (%s) failed during %s; answering as a miss until it recovers", self.store.kind, op)

    # ------------------------------------------------------------------ background work

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        for i in range(self.settings.limits.create_workers):
            tg.create_task(self._ensure_worker(), name=f"gemini-create-{i}")
        self.maintenance.start(tg)
        tg.create_task(self._flush_loop(), name="gemini-counter-flush")
        tg.create_task(self._sweep_loop(), name="gemini-sweep")

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.limits.counter_flush_s)
            await self.tally.flush()

    async def _sweep_loop(self) -> None:
        limits = self.settings.limits
        while True:
            await asyncio.sleep(limits.sweep_interval_s)
            try:
                self.maintenance.handle_removed(await self.store.prune_expired(self.clock(), limits.sweep_batch))
                counts = await self.store.counts()
            except StateError:
                self._store_failed("sweep")
                continue
            self._set_gauges(counts.per_backend)

    def _set_gauges(self, per_backend: dict[str, tuple[int, int]]) -> None:
        for backend in self.settings.backends:
            entries, negatives = per_backend.get(backend, (0, 0))
            self.metrics.entries.labels(backend).set(entries)
            self.metrics.negative_entries.labels(backend).set(negatives)

    async def close(self) -> None:
        """Resolve every queued ensure (the process is stopping) and flush the counters."""
        while not self._ensure_q.empty():
            job = self._ensure_q.get_nowait()
            if not job.future.done():
                job.future.set_result(EnsureReply(EnsureOutcome.FAILED, error="service stopping"))
        await self.tally.flush()

    # ------------------------------------------------------------------ lookup

    def _live_now(self) -> float:
        # An entry this close to its expiry is not handed out: the request carrying it would
        # reach Google after the resource is gone.
        return self.clock() + self.settings.limits.live_margin_s

    async def lookup(self, req: LookupRequest) -> LookupReply:
        if req.backend not in self.settings.backends:
            self.metrics.dropped.labels("unknown_backend").inc()
            return LookupReply(LookupResult.MISS)
        try:
            state = await self.store.lookup(req.backend, req.digest, self._live_now(), touch=True)
        except StateError:
            self._store_failed("lookup")
            return LookupReply(LookupResult.MISS)
        if state.expired is not None:
            self.tally.removed(req.backend, "expired")
        if state.found is Found.HIT and state.entry is not None and state.entry.model == req.model:
            entry = state.entry
            self.tally.lookup(req.backend, "hit")
            if self.settings.cache.extend_on_hit and should_extend(entry, self.clock()):
                self.maintenance.schedule_extend(entry)
            return LookupReply(
                LookupResult.HIT, cached_content=entry.name, expire_at=entry.expire_at, token_count=entry.token_count
            )
        if state.found is Found.NEGATIVE and state.negative is not None:
            self.tally.lookup(req.backend, "negative")
            return LookupReply(
                LookupResult.NEGATIVE,
                negative_until=state.negative.until,
                min_total_token_count=state.negative.min_total_token_count,
            )
        self.tally.lookup(req.backend, "miss")
        in_flight = state.in_flight or entry_id(req.backend, req.digest) in self._active
        return LookupReply(LookupResult.MISS, in_flight=in_flight)

    # ------------------------------------------------------------------ ensure

    def submit_ensure(self, req: EnsureRequest) -> asyncio.Future[EnsureReply]:
        """Queue a create unless it is ineligible or already queued/running here. Never blocks;
        the future resolves when the outcome is known."""
        future: asyncio.Future[EnsureReply] = asyncio.get_running_loop().create_future()
        label = req.backend if req.backend in self.settings.backends else "-"
        future.add_done_callback(lambda f: self._count_ensure(label, f))
        reason = ineligible_reason(req, self.settings)
        if reason is not None:
            self.tally.count(label, "invalid_ensures")
            future.set_result(EnsureReply(EnsureOutcome.INELIGIBLE, error=reason))
            return future
        rid = entry_id(req.backend, req.digest)
        if rid in self._active:
            future.set_result(EnsureReply(EnsureOutcome.IN_FLIGHT))
            return future
        try:
            self._ensure_q.put_nowait(_EnsureJob(req, future))
        except asyncio.QueueFull:
            self.metrics.dropped.labels("ensure_queue_full").inc()
            future.set_result(EnsureReply(EnsureOutcome.OVERLOADED, error="create queue full"))
            return future
        self._active.add(rid)
        return future

    async def ensure(self, req: EnsureRequest) -> EnsureReply:
        return await asyncio.shield(self.submit_ensure(req))

    def _count_ensure(self, backend: str, future: asyncio.Future[EnsureReply]) -> None:
        if not future.cancelled():
            self.metrics.ensures.labels(backend, future.result().outcome.value).inc()

    async def _ensure_worker(self) -> None:
        while True:
            job = await self._ensure_q.get()
            try:
                reply = await self._ensure_once(job.req)
            except StateError:
                self._store_failed("ensure")
                reply = EnsureReply(EnsureOutcome.FAILED, error="state store unavailable")
            except Exception:  # a bug must not kill the worker; the ensure is answered
                log.exception("ensure failed unexpectedly (backend %s)", job.req.backend)
                reply = EnsureReply(EnsureOutcome.FAILED, error="internal error")
            finally:
                self._active.discard(entry_id(job.req.backend, job.req.digest))
            if not job.future.done():
                job.future.set_result(reply)

    async def _existing(self, req: EnsureRequest) -> EnsureReply | None:
        state = await self.store.lookup(req.backend, req.digest, self._live_now(), touch=False)
        if state.expired is not None:
            self.tally.removed(req.backend, "expired")
        if state.found is Found.HIT and state.entry is not None:
            return EnsureReply(EnsureOutcome.EXISTS, cached_content=state.entry.name, expire_at=state.entry.expire_at)
        if state.found is Found.NEGATIVE and state.negative is not None:
            return EnsureReply(EnsureOutcome.NEGATIVE, min_total_token_count=state.negative.min_total_token_count)
        if state.in_flight:
            return EnsureReply(EnsureOutcome.IN_FLIGHT)
        return None

    async def _ensure_once(self, req: EnsureRequest) -> EnsureReply:
        existing = await self._existing(req)
        if existing is not None:
            return existing
        token = secrets.token_hex(16)
        lock_ms = self.settings.cache.create_timeout_ms + self.settings.limits.lock_margin_ms
        if not await self.store.acquire_create_lock(req.backend, req.digest, token, lock_ms):
            return EnsureReply(EnsureOutcome.IN_FLIGHT)
        self.metrics.in_flight.inc()
        try:
            # Another replica may have finished between our read and our lock.
            existing = await self._existing_after_lock(req)
            return existing if existing is not None else await self._create(req)
        finally:
            self.metrics.in_flight.dec()
            try:
                await self.store.release_create_lock(req.backend, req.digest, token)
            except StateError:
                self.metrics.store_errors.labels("unlock").inc()  # the lock expires by itself

    async def _existing_after_lock(self, req: EnsureRequest) -> EnsureReply | None:
        state = await self.store.lookup(req.backend, req.digest, self._live_now(), touch=False)
        if state.found is Found.HIT and state.entry is not None:
            return EnsureReply(EnsureOutcome.EXISTS, cached_content=state.entry.name, expire_at=state.entry.expire_at)
        if state.found is Found.NEGATIVE and state.negative is not None:
            return EnsureReply(EnsureOutcome.NEGATIVE, min_total_token_count=state.negative.min_total_token_count)
        return None

    async def _create(self, req: EnsureRequest) -> EnsureReply:
        cache = self.settings.cache
        ttl = req.ttl_seconds or cache.ttl
        result = await self.google.create(
            req.backend,
            req.model,
            req.system_instruction,
            ttl,
            display_name=f"continuum-{req.digest[:16]}",
            timeout_s=cache.create_timeout_ms / 1000,
        )
        now = self.clock()
        if result.ok and result.info is not None:
            info = result.info
            entry = Entry(
                req.backend, req.digest, req.model, info.name, info.expire_at, ttl, now, info.total_token_count
            )
            try:
                removed = await self.store.put_entry(entry, now, cache.max_entries)
            except StateError:
                # Google holds a cache nobody can find: delete it rather than pay for it.
                self._create_failed(req.backend, "store")
                self.maintenance.schedule_delete(req.backend, info.name)
                return EnsureReply(EnsureOutcome.FAILED, error="state store unavailable")
            self.metrics.creates.labels(req.backend).inc()
            self.tally.count(req.backend, "creates")
            self.maintenance.handle_removed(removed)
            log.info("created cache for digest %s on backend %s", short_hash(req.digest), req.backend)
            return EnsureReply(EnsureOutcome.CREATED, cached_content=info.name, expire_at=info.expire_at)
        verdict = classify_create_failure(result.status, result.error, result.failure)
        self._create_failed(req.backend, verdict.reason)
        log.warning(
            "create for digest %s on backend %s failed: %s (HTTP %s %s)",
            short_hash(req.digest),
            req.backend,
            verdict.reason,
            result.status or "-",
            result.error.status if result.error else "",
        )
        if not verdict.negative:
            return EnsureReply(EnsureOutcome.FAILED, error=verdict.reason)
        error = result.error
        negative = NegativeEntry(
            req.backend,
            req.digest,
            req.model,
            until=now + cache.negative_ttl_seconds,
            created_at=now,
            min_total_token_count=error.min_total_token_count if error else None,
            total_token_count=error.total_token_count if error else None,
        )
        try:
            self.maintenance.handle_removed(await self.store.put_negative(negative, now, cache.max_entries))
        except StateError:
            self._store_failed("put_negative")
        return EnsureReply(
            EnsureOutcome.REJECTED, min_total_token_count=negative.min_total_token_count, error=verdict.reason
        )

    def _create_failed(self, backend: str, reason: str) -> None:
        self.metrics.create_failures.labels(backend, reason).inc()
        self.tally.count(backend, "create_failures")

    # ------------------------------------------------------------------ drop, usage, admin

    async def drop(self, req: DropRequest) -> DropReply:
        try:
            entry = await self.store.drop(req.backend, req.digest, req.cached_content)
        except StateError:
            self._store_failed("drop")
            return DropReply(False)
        if entry is not None:
            self.tally.removed(req.backend, "stale")
        return DropReply(entry is not None)

    def record_usage(self, report: UsageReport) -> None:
        for backend, counters in report.backends.items():
            if backend not in self.settings.backends:
                self.metrics.dropped.labels("unknown_backend").inc()
                continue
            for outcome in RequestOutcome:
                n = counters.get(outcome.value, 0)
                if n:
                    self.metrics.requests.labels(backend, outcome.value).inc(n)
                    self.tally.count(backend, outcome.value, n)
            tokens = counters.get("cached_tokens", 0)
            if tokens:
                self.metrics.cached_tokens.labels(backend).inc(tokens)
                self.tally.count(backend, "cached_tokens", tokens)

    async def stats(self) -> dict[str, Any]:
        await self.tally.flush()
        try:
            self.maintenance.handle_removed(
                await self.store.prune_expired(self.clock(), self.settings.limits.sweep_batch)
            )
            counts = await self.store.counts()
            counters = await self.store.read_counters()
        except StateError:
            self._store_failed("stats")
            return {"enabled": True, "success": False, "error": "state store unavailable"}
        self._set_gauges(counts.per_backend)
        return build_stats(self.settings, self.store.kind, counts, counters)

    async def clear(self) -> ClearReply:
        try:
            entries, negatives = await self.store.clear()
        except StateError:
            self._store_failed("clear")
            return ClearReply(False, error="state store unavailable")
        for entry in entries:
            self.tally.removed(entry.backend, "cleared")
        self.maintenance.delete_all(entries)
        log.info("cleared %d entries and %d negative entries", len(entries), negatives)
        return ClearReply(True, cleared_entries=len(entries), cleared_negative_entries=negatives)
