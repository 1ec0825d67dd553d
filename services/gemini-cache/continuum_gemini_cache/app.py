"""Composition root of `continuum-gemini-cache`: builds the store, the Google client, the
service and the bus adapter; owns the TaskGroup of background work and the shutdown order.

`continuum-router up` can run it inside its own process (embedded mode, memory state) with
`GeminiCacheApp(cfg, nats_url=...)`; standalone it runs under `__main__`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from typing import Literal

from nats.aio.client import Client as NatsClient

from continuum_common.asgi_server import EmbeddedServer
from continuum_common.bus import connect
from continuum_common.config.router import RouterConfig
from continuum_common.loop_lag import measure_loop_lag
from continuum_common.redis_client import make_redis
from continuum_gemini_cache.adapters.bus import BusAdapter
from continuum_gemini_cache.adapters.google_api import GoogleCacheApi
from continuum_gemini_cache.adapters.http import http_app
from continuum_gemini_cache.adapters.redis_store import RedisStore
from continuum_gemini_cache.config import Limits, Settings, resolve
from continuum_gemini_cache.errors import GeminiCacheError
from continuum_gemini_cache.memory_store import MemoryStore
from continuum_gemini_cache.metrics import Metrics
from continuum_gemini_cache.service import GeminiCacheService
from continuum_gemini_cache.store import Store

log = logging.getLogger("continuum.gemini_cache")

StateKind = Literal["auto", "memory", "redis"]


class _Shutdown(Exception):
    """Raised inside the TaskGroup to cancel the background tasks on stop."""


class GeminiCacheApp:
    def __init__(
        self,
        cfg: RouterConfig,
        *,
        source: str = "config",
        nats_url: str | None = None,
        state: StateKind = "auto",
        clock: Callable[[], float] = time.time,
        limits: Limits | None = None,
        http_host: str = "127.0.0.1",
        http_port: int | None = None,
        name: str = "continuum-gemini-cache",
    ) -> None:
        self.cfg = cfg
        self.settings: Settings = resolve(cfg, source=source, limits=limits)  # DisabledError when off
        self.metrics = Metrics(sorted(self.settings.backends))
        self.store = self._make_store(state)
        self.google = GoogleCacheApi(self.settings.backends, self.metrics)
        self.service = GeminiCacheService(self.settings, self.store, self.google, self.metrics, clock=clock)
        self._nats_url = nats_url
        self._name = name
        self._nc: NatsClient | None = None
        self._bus: BusAdapter | None = None
        self._http = (
            EmbeddedServer(http_app(self.metrics.registry, self._health), http_host, http_port)
            if http_port is not None
            else None
        )
        self._stopping = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    def _make_store(self, state: StateKind) -> Store:
        conn = self.cfg.redis_connection()
        if state == "memory" or (state == "auto" and conn is None):
            return MemoryStore()
        if conn is None:
            raise GeminiCacheError("state 'redis' needs a redis section (redis.url) in the configuration")
        return RedisStore(make_redis(conn), self.settings.cache.key_prefix)

    @property
    def http_url(self) -> str | None:
        return self._http.url if self._http is not None else None

    async def _health(self) -> dict[str, bool]:
        nats_ok = self._nc is not None and self._nc.is_connected
        return {"nats": nats_ok, "state_store": await self.store.ping()}

    async def start(self) -> None:
        if not await self.store.ping():
            log.warning("state store (%s) is not reachable yet; lookups answer miss until it is", self.store.kind)
        self._nc = await connect(self.cfg.bus, name=self._name, url=self._nats_url)
        ready = asyncio.Event()
        self._runner = asyncio.create_task(self._run(ready), name="gemini-cache")
        await ready.wait()
        self._bus = BusAdapter(self._nc, self.service, self.metrics, self.settings.limits)
        await self._bus.start()
        if self._http is not None:
            await self._http.start()
        log.info(
            "gemini-cache ready: %d gemini backend(s), state=%s, max_entries=%d",
            len(self.settings.backends),
            self.store.kind,
            self.settings.cache.max_entries,
        )

    async def _run(self, ready: asyncio.Event) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                self.service.start_background(tg)
                tg.create_task(measure_loop_lag(self.metrics.loop_lag.observe, self._stopping), name="loop-lag")
                ready.set()
                await self._stopping.wait()
                raise _Shutdown
        except* _Shutdown:
            pass

    async def stop(self) -> None:
        if self._bus is not None:
            await self._bus.stop()  # no new work first
        self._stopping.set()
        if self._runner is not None:
            await self._runner
            self._runner = None
        await self.service.close()  # answer queued ensures, flush counters
        await self.google.aclose()
        await self.store.aclose()
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.drain(), 5)
            except Exception:
                await self._nc.close()
            self._nc = None
        if self._http is not None:
            await self._http.stop()

    async def serve_forever(self) -> None:
        """Start, run until SIGINT/SIGTERM, stop."""
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            log.info("stopping")
            await self.stop()
