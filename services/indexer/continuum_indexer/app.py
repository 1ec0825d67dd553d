"""Composition root of `continuum-indexer`: builds the indexes (prefix-key and block, on one
Redis client), the NATS connection, the feeds (JetStream consumer, SSE sources,
maintenance), the admin responder and the health/metrics server; owns the TaskGroup and the
shutdown order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from nats.aio.client import Client as NatsClient

from continuum_common.bus import connect
from continuum_common.kvindex import BlockIndexStore, KvIndexStore, open_block_index, open_kv_index
from continuum_common.loop_lag import measure_loop_lag
from continuum_common.redis_client import RedisClient, make_redis
from continuum_common.tracing import Tracing
from continuum_common.wire import indexer_admin as admin
from continuum_indexer.adapters.admin_nats import AdminResponder
from continuum_indexer.adapters.http import HealthServer
from continuum_indexer.config import IndexerSettings
from continuum_indexer.index_feeds import IndexFeeds
from continuum_indexer.metrics import EVENT_BUS_SOURCE, IndexerMetrics

log = logging.getLogger("continuum.indexer")


class IndexerApp:
    def __init__(
        self, settings: IndexerSettings, index: KvIndexStore | None = None, blocks: BlockIndexStore | None = None
    ) -> None:
        self.settings = settings
        self.metrics = IndexerMetrics(settings.known_backends(), loop_lag=True)
        self._index = index
        self._blocks = blocks
        self.index: KvIndexStore | None = None
        self.blocks: BlockIndexStore | None = None
        self._redis: RedisClient | None = None  # the client both indexes share, when this app made it
        self.nc: NatsClient | None = None
        self.feeds: IndexFeeds | None = None
        self.http: HealthServer | None = None
        self.started = asyncio.Event()  # set when every part runs (tests, `up`)
        # Spans of index writes, linked to the listener's (the router file's `tracing` section).
        self.tracing = Tracing(settings.config.tracing, "indexer")

    def health(self) -> tuple[bool, dict[str, Any]]:
        feeds, nc = self.feeds, self.nc
        bus = bool(nc is not None and nc.is_connected)
        bound = bool(feeds is not None and feeds.consumer.ready.is_set())
        index_ok = bool(feeds is not None and feeds.index_ok)
        last = feeds.sink.last_apply_at if feeds is not None else None
        snapshot = feeds.block_snapshot if feeds is not None else None
        return bus and bound and index_ok, {
            "bus_connected": bus,
            "consumer_bound": bound,
            "index_ok": index_ok,
            "seconds_since_last_apply": None if last is None else round(time.time() - last, 3),
            # as of the last maintenance pass (every few seconds); ages are brought up to now
            "blocks": None if snapshot is None else admin.blocks_body(snapshot[0], time.monotonic() - snapshot[1]),
        }

    def _open_indexes(self) -> tuple[KvIndexStore, BlockIndexStore]:
        cfg = self.settings.config
        if cfg.kv_cache_index.backend == "redis" and (self._index is None or self._blocks is None):
            connection = cfg.redis_connection()
            if connection is not None:  # else the factories say what is missing
                self._redis = make_redis(connection)
        index = self._index or open_kv_index(cfg, self._redis)
        blocks = self._blocks or open_block_index(cfg, self._redis)
        return index, blocks

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.settings.config
        self.index, self.blocks = self._open_indexes()
        self.metrics.connected.labels(EVENT_BUS_SOURCE).set(0)
        self.nc = await connect(cfg.bus, name="continuum-indexer", url=self.settings.nats_url)
        responder: AdminResponder | None = None
        try:
            # The consumer makes sure stream CONTINUUM_KV exists before each bind and retries
            # with backoff while it cannot (a NATS cluster still electing its leaders, a stream
            # limit the servers refuse): /healthz reports not ready meanwhile, the process stays.
            self.feeds = IndexFeeds(self.settings, self.index, self.nc, self.metrics, self.blocks, tracing=self.tracing)
            responder = AdminResponder(self.nc, cfg.kv_cache_index, self.index, self.feeds, self.metrics)
            await responder.start()
            if self.settings.listen is not None:
                host, port = self.settings.listen
                self.http = HealthServer(host, port, self.metrics.registry, self.health)
                await self.http.start()
            async with asyncio.TaskGroup() as tg:
                feeds_task = tg.create_task(self.feeds.run(), name="feeds")
                if self.metrics.loop_lag is not None:
                    tg.create_task(measure_loop_lag(self.metrics.loop_lag.observe, stop), name="loop-lag")
                self.started.set()
                await stop.wait()
                log.info("stopping: finishing the batch in hand")
                self.feeds.stop()
                await feeds_task
        finally:
            await self._close(responder)

    async def _close(self, responder: AdminResponder | None) -> None:
        if responder is not None:
            await responder.close()
        if self.http is not None:
            await self.http.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self.nc.drain()
            with contextlib.suppress(Exception):
                await self.nc.close()
        self.tracing.shutdown()  # flushes queued spans (bounded by the exporter's timeout)
        if self.index is not None:
            await self.index.close()
        if self.blocks is not None:
            await self.blocks.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
        log.info("stopped")
