"""Background calls to Google that no request waits for: best-effort DELETE of evicted,
replaced and cleared caches (to stop storage billing early) and the extend-on-hit PATCH.
One bounded queue, a few workers; a full queue is a counted drop."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from continuum_gemini_cache.adapters.google_api import GoogleCacheApi
from continuum_gemini_cache.config import Settings
from continuum_gemini_cache.errors import StateError
from continuum_gemini_cache.metrics import Metrics
from continuum_gemini_cache.model import Entry, Removal, Removed
from continuum_gemini_cache.stats import StatsTally
from continuum_gemini_cache.store import Store

log = logging.getLogger("continuum.gemini_cache.maintenance")

_CLEAR_CONCURRENCY = 4
_MAX_CLEAR_TASKS = 4


@dataclass(frozen=True, slots=True)
class _Delete:
    backend: str
    name: str


@dataclass(frozen=True, slots=True)
class _Extend:
    entry: Entry


class Maintenance:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        google: GoogleCacheApi,
        metrics: Metrics,
        tally: StatsTally,
        *,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._store = store
        self._google = google
        self._metrics = metrics
        self._tally = tally
        self._clock = clock
        self._queue: asyncio.Queue[_Delete | _Extend] = asyncio.Queue(maxsize=settings.limits.maintenance_queue)
        self._extending: set[str] = set()  # entry ids with a PATCH queued or running here
        self._tg: asyncio.TaskGroup | None = None
        self._clear_tasks: set[asyncio.Task[None]] = set()

    def start(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg
        for i in range(self._settings.limits.maintenance_workers):
            tg.create_task(self._worker(), name=f"gemini-maintenance-{i}")

    def _offer(self, job: _Delete | _Extend) -> bool:
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._metrics.dropped.labels("maintenance_queue_full").inc()
            return False
        return True

    # ------------------------------------------------------------------ producers

    def handle_removed(self, removed: Sequence[Removed]) -> None:
        """Account for records a store operation removed; DELETE the resources still billed."""
        for item in removed:
            backend = item.backend
            if item.reason is Removal.EVICTED:
                self._metrics.evictions.labels(backend).inc()
                self._tally.count(backend, "evictions")
            else:
                self._tally.removed(backend, item.reason.value)
            if item.entry is not None and item.reason in (Removal.EVICTED, Removal.REPLACED):
                self.schedule_delete(backend, item.entry.name)

    def schedule_delete(self, backend: str, name: str) -> None:
        if backend in self._settings.backends:
            self._offer(_Delete(backend, name))

    def schedule_extend(self, entry: Entry) -> None:
        """Once per entry at a time on this replica; the store's extend lock makes it once
        across replicas."""
        if entry.id in self._extending:
            return
        if self._offer(_Extend(entry)):
            self._extending.add(entry.id)

    def delete_all(self, entries: Sequence[Entry]) -> None:
        """DELETE every cleared resource in the background (bounded concurrency). The list is
        bounded by max_entries; at most a few clears run at once, more are counted drops."""
        if not entries:
            return
        if self._tg is None or len(self._clear_tasks) >= _MAX_CLEAR_TASKS:
            self._metrics.dropped.labels("maintenance_queue_full").inc(len(entries))
            return
        task = self._tg.create_task(self._delete_many(list(entries)), name="gemini-clear-delete")
        self._clear_tasks.add(task)
        task.add_done_callback(self._clear_tasks.discard)

    # ------------------------------------------------------------------ workers

    async def _worker(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                if isinstance(job, _Delete):
                    await self._delete(job.backend, job.name)
                else:
                    await self._extend(job.entry)
            except Exception:  # keep the worker alive; the job is best effort
                log.exception("maintenance job failed unexpectedly")
            finally:
                if isinstance(job, _Extend):
                    self._extending.discard(job.entry.id)

    async def _delete_many(self, entries: list[Entry]) -> None:
        gate = asyncio.Semaphore(_CLEAR_CONCURRENCY)

        async def one(entry: Entry) -> None:
            async with gate:
                await self._delete(entry.backend, entry.name)

        await asyncio.gather(*(one(e) for e in entries if e.backend in self._settings.backends))

    async def _delete(self, backend: str, name: str) -> None:
        result = await self._google.delete(backend, name, self._settings.limits.maintenance_timeout_s)
        # 403/404: already gone at Google (expired, deleted elsewhere), which is the goal.
        ok = result.ok or result.status in (403, 404)
        self._metrics.deletes.labels(backend, "ok" if ok else "failed").inc()
        self._tally.count(backend, "deletes" if ok else "delete_failures")

    async def _extend(self, entry: Entry) -> None:
        token = secrets.token_hex(16)
        # Held until it expires, also after success: the entry then has a full TTL again, so
        # no replica needs to extend it for 80 % of a TTL, longer than this lock lives.
        lock_ms = int(min(self._settings.limits.extend_lock_ms, entry.ttl_seconds * 500))
        try:
            if not await self._store.acquire_extend_lock(entry.backend, entry.digest, token, lock_ms):
                return
        except StateError:
            self._metrics.store_errors.labels("extend_lock").inc()
            return
        result = await self._google.patch_ttl(
            entry.backend, entry.name, entry.ttl_seconds, self._settings.limits.maintenance_timeout_s
        )
        if result.ok and result.info is not None:
            self._metrics.extends.labels(entry.backend, "ok").inc()
            self._tally.count(entry.backend, "extends")
            try:
                await self._store.update_expiry(entry, result.info.expire_at, entry.ttl_seconds)
            except StateError:
                self._metrics.store_errors.labels("update_expiry").inc()
            return
        self._metrics.extends.labels(entry.backend, "failed").inc()
        self._tally.count(entry.backend, "extend_failures")
        if result.status in (403, 404):
            # The resource is gone at Google: forget it so the next miss re-creates it.
            try:
                if await self._store.drop(entry.backend, entry.digest, entry.name) is not None:
                    self._tally.removed(entry.backend, "stale")
            except StateError:
                self._metrics.store_errors.labels("drop").inc()
