"""IndexFeeds: everything that moves events into the indexes (the prefix index and the block
index): the JetStream consumer, the SSE sources and the periodic maintenance (TTL sweeps,
gauges, the block snapshot /healthz shows). The indexer service runs it with a durable
consumer; the ingress runs it in embedded memory mode with a private one (embedded.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.aio.client import Client as NatsClient

from continuum_common.bus import ensure_kv_stream
from continuum_common.kvindex import BlockIndexStats, BlockIndexWriter, KvIndexError, KvIndexWriter
from continuum_common.tracing import Tracing
from continuum_common.wire.indexer_admin import SourceStats
from continuum_indexer.adapters.jetstream import JetStreamConsumer
from continuum_indexer.adapters.resync import ResyncRequester
from continuum_indexer.adapters.sse_source import SseSource
from continuum_indexer.config import IndexerSettings
from continuum_indexer.event_sink import EventSink
from continuum_indexer.metrics import IndexerMetrics

log = logging.getLogger("continuum.indexer")


class IndexFeeds:
    def __init__(
        self,
        settings: IndexerSettings,
        index: KvIndexWriter,
        nc: NatsClient,
        metrics: IndexerMetrics,
        blocks: BlockIndexWriter,
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.index = index
        self.blocks = blocks
        self.metrics = metrics
        # A backend whose history the block index lacks is restated by its listener on request.
        requester = ResyncRequester(nc, metrics, requester=settings.consumer.durable or "embedded")
        self.sink = EventSink(index, metrics, blocks=blocks, on_gaps=requester.request)
        self.consumer = JetStreamConsumer(
            nc,
            self.sink,
            settings.consumer,
            skip_backends=settings.sse_backends,
            prepare=lambda: ensure_kv_stream(nc.jetstream(), settings.config.bus),
            tracing=tracing,
        )
        self.sse_sources = [SseSource(s, self.sink) for s in settings.sse_sources]
        self.index_ok = True
        self.last_maintenance_at: float | None = None
        # the block index as of the last maintenance pass (and when, monotonic): /healthz
        # shows it without a Redis round trip
        self.block_snapshot: tuple[BlockIndexStats, float] | None = None
        self._stop = asyncio.Event()

    def source_stats(self) -> list[SourceStats]:
        return [self.consumer.stats, *(s.stats for s in self.sse_sources)]

    def stop(self) -> None:
        """Stop fetching; the batch in hand is still applied and acked."""
        self.consumer.stop()
        self._stop.set()

    async def run(self) -> None:
        """Run until stop() (then return) or cancellation."""
        async with asyncio.TaskGroup() as tg:
            consumer = tg.create_task(self.consumer.run(), name="jetstream-consumer")
            others = [tg.create_task(s.run(), name=f"sse-{s.backend}") for s in self.sse_sources]
            others.append(tg.create_task(self._maintenance(), name="index-maintenance"))
            await self._stop.wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.shutdown_grace_s):
                    await asyncio.shield(consumer)
            for task in (consumer, *others):
                task.cancel()

    async def _maintenance(self) -> None:
        while True:
            await asyncio.sleep(self.settings.maintenance_interval_s)
            await self.maintain_once()

    async def maintain_once(self) -> None:
        await self.consumer.report_pending(self.metrics.consumer_pending)
        try:
            expired = await self.index.cleanup_expired()
            stats = await self.index.stats()
            expired += await self.blocks.cleanup()
            blocks = await self.blocks.block_stats()
        except KvIndexError as exc:
            self.index_ok = False
            self.metrics.errors.labels("maintenance").inc()
            log.warning("index maintenance failed: %s", exc)
            return
        self.index_ok = True
        self.last_maintenance_at = time.time()
        self.block_snapshot = (blocks, time.monotonic())
        m = self.metrics
        m.prefixes.set(stats.prefix_count)
        m.entries.set(stats.entry_count)
        m.evictions.set(stats.total_evictions)
        m.block_index_blocks.labels("gpu").set(sum(b.gpu_blocks for b in blocks.backends.values()))
        m.block_index_blocks.labels("storage").set(sum(b.storage_blocks for b in blocks.backends.values()))
        m.block_index_backends.set(len(blocks.backends))
        if expired:
            log.debug("swept %d expired index entries", expired)
