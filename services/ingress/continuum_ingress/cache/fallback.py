"""Automatic in-memory fallback in front of the shared store (seed Tier 3 "자동 폴백").

On the first connection failure or timeout of the shared store, `FallbackCacheStore` switches
to an in-memory LRU (`fallback_capacity` entries, TTL at most `fallback_ttl_seconds`) and keeps
serving; with `fallback_to_memory: false` it bypasses instead (every read a miss, every write
dropped). Either way no error ever leaves this class: a chat request never fails because
Redis did. A monitor task owned by whoever calls `start()` (or enters `async with`) pings the
shared store every `monitor_interval_s` (30 s by default) while falling back and switches back
when it answers. The memory entries are dropped on switch-back: they were never in Redis, and
keeping them would let a later outage serve entries older than an invalidation.

If an invalidation arrives while Redis is down, the memory side is cleared at once and the
Redis side is cleared by the monitor before it switches back, so stale entries never return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from continuum_ingress.cache.errors import CacheBackendError
from continuum_ingress.cache.memory import InMemoryCacheStore
from continuum_ingress.cache.metrics import CacheMetrics
from continuum_ingress.cache.store import CacheStoreStats

log = logging.getLogger(__name__)


class SharedStore(Protocol):
    """What the fallback needs from the shared store (RedisCacheStore)."""

    backend: str

    async def get(self, key: str) -> bytes | None: ...
    async def set(self, key: str, value: bytes, ttl: float) -> None: ...
    async def delete(self, key: str) -> None: ...
    async def clear(self) -> int: ...
    async def stats(self) -> CacheStoreStats: ...
    async def ping(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ClearResult:
    cleared: int
    error: str | None = None


class FallbackCacheStore:
    def __init__(
        self,
        primary: SharedStore,
        *,
        fallback_to_memory: bool = True,
        fallback_capacity: int = 1000,
        fallback_ttl_seconds: float = 300.0,
        monitor_interval_s: float = 30.0,
        metrics: CacheMetrics | None = None,
    ) -> None:
        self.primary = primary
        self.backend = primary.backend
        self.fallback_to_memory = fallback_to_memory
        self.fallback_ttl_seconds = fallback_ttl_seconds
        self.monitor_interval_s = monitor_interval_s
        self.memory = InMemoryCacheStore(fallback_capacity)
        self._metrics = metrics
        self._active = False
        self._pending_clear = False
        self._switches = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # state -------------------------------------------------------------------------------
    @property
    def fallback_active(self) -> bool:
        return self._active

    @property
    def mode(self) -> str:
        """`redis` normally; `memory` or `bypass` while the shared store is down."""
        if not self._active:
            return self.backend
        return "memory" if self.fallback_to_memory else "bypass"

    @property
    def switches(self) -> int:
        """How many times the store fell back (for stats and tests)."""
        return self._switches

    def configure(
        self,
        *,
        fallback_to_memory: bool,
        fallback_capacity: int,
        fallback_ttl_seconds: float,
        monitor_interval_s: float | None = None,
    ) -> None:
        """Hot reload of the fallback fields."""
        self.fallback_to_memory = fallback_to_memory
        self.fallback_ttl_seconds = fallback_ttl_seconds
        self.memory.resize(fallback_capacity)
        if not fallback_to_memory:
            self.memory.clear_now()
        if monitor_interval_s is not None:
            self.monitor_interval_s = monitor_interval_s
            self._wake.set()

    def _fall_back(self, error: CacheBackendError) -> None:
        if self._active:
            return
        self._active = True
        self._switches += 1
        if self._metrics is not None:
            self._metrics.fallback_active.set(1)
            self._metrics.fallback_episodes.inc()
        log.warning(
            "response cache: shared store %s failed (%s during %s); %s until it answers again",
            self.backend,
            error.kind,
            error.operation,
            "serving from the in-memory fallback" if self.fallback_to_memory else "bypassing the cache",
        )
        self._wake.set()

    def _recover(self) -> None:
        self._active = False
        self.memory.clear_now()
        if self._metrics is not None:
            self._metrics.fallback_active.set(0)
        log.info("response cache: shared store %s answers again; fallback off", self.backend)

    # CacheStore protocol ----------------------------------------------------------------
    async def get(self, key: str) -> bytes | None:
        if not self._active:
            try:
                return await self.primary.get(key)
            except CacheBackendError as exc:
                if not exc.is_outage:
                    return None
                self._fall_back(exc)
        return self.memory.get_now(key) if self.fallback_to_memory else None

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        if not self._active:
            try:
                await self.primary.set(key, value, ttl)
                return
            except CacheBackendError as exc:
                if not exc.is_outage:
                    return
                self._fall_back(exc)
        if self.fallback_to_memory:
            self.memory.set_now(key, value, min(ttl, self.fallback_ttl_seconds))

    async def delete(self, key: str) -> None:
        self.memory.delete_now(key)
        if not self._active:
            try:
                await self.primary.delete(key)
            except CacheBackendError as exc:
                if exc.is_outage:
                    self._fall_back(exc)

    async def clear(self) -> int:
        return (await self.clear_all()).cleared

    async def clear_all(self) -> ClearResult:
        """Clear both sides. A failure on the shared side is reported, not raised, and the
        shared side is then cleared by the monitor before the fallback switches back."""
        cleared = self.memory.clear_now()
        try:
            cleared += await self.primary.clear()
        except CacheBackendError as exc:
            self._pending_clear = True
            if exc.is_outage:
                self._fall_back(exc)
            return ClearResult(cleared, f"{self.backend} unavailable ({exc.kind}); it is cleared when it answers again")
        self._pending_clear = False
        return ClearResult(cleared)

    async def stats(self) -> CacheStoreStats:
        if self._active:
            return self.memory.stats_now()
        try:
            return await self.primary.stats()
        except CacheBackendError as exc:
            if exc.is_outage:
                self._fall_back(exc)
            return self.memory.stats_now()

    # monitor ----------------------------------------------------------------------------
    async def probe(self) -> bool:
        """One recovery attempt: ping (and finish a pending clear), switch back on success."""
        if not self._active:
            return True
        try:
            await self.primary.ping()
            if self._pending_clear:
                await self.primary.clear()
                self._pending_clear = False
        except CacheBackendError:
            return False
        self._recover()
        return True

    async def _monitor(self) -> None:
        while True:
            if not self._active:
                # Idle until a failure switches us over (no polling while Redis is healthy).
                self._wake.clear()
                await self._wake.wait()
                continue
            # Sleep a full interval first: the failure that switched us over just happened.
            await asyncio.sleep(self.monitor_interval_s)
            try:
                await self.probe()
            except Exception:  # a bug must not end the monitor and strand us in fallback
                log.exception("response cache: fallback monitor probe failed")

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._monitor(), name="response-cache-redis-monitor")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
