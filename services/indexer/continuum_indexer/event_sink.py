"""EventSink: the one path from any transport (JetStream, SSE) into the indexes, with the
metrics and the fleet-wide counters every transport shares: version-1 prefix-key events into
the prefix index, version-2 KV batches (JetStream only) into the block index."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from continuum_common.events import KvEvent
from continuum_common.kvindex import ApplyReport, BlockApplyReport, BlockIndexWriter, KvIndexError, KvIndexWriter
from continuum_common.wire.kv import KvBatch
from continuum_indexer.metrics import IndexerMetrics


class EventSink:
    def __init__(
        self,
        index: KvIndexWriter,
        metrics: IndexerMetrics,
        clock: Callable[[], float] = time.time,
        *,
        blocks: BlockIndexWriter | None = None,
        on_gaps: Callable[[set[str]], Awaitable[None]] | None = None,
    ) -> None:
        self.index = index
        self.blocks = blocks  # None: a sink that only takes version-1 events (an SSE source's)
        # Called with the backends whose history the block index lacks (a resync request).
        self.on_gaps = on_gaps
        self.metrics = metrics
        self._clock = clock
        self.last_apply_at: float | None = None

    def received(self, backend: str, transport: str, count: int = 1) -> None:
        self.metrics.received.labels(self.metrics.backend(backend), transport).inc(count)
        self.index.count_events(backend, received=count)

    def received_batch(self, events: Sequence[KvEvent], transport: str) -> None:
        for backend, count in Counter(e.backend for e in events).items():
            self.received(backend, transport, count)

    def dropped(self, backend: str | None, reason: str, count: int = 1) -> None:
        self.metrics.drop(backend, reason, count)
        if backend is not None:
            self.index.count_events(backend, dropped=count)

    async def apply(self, events: Sequence[KvEvent]) -> ApplyReport:
        """Apply a batch; KvIndexError propagates (the transport retries the batch)."""
        if not events:
            return ApplyReport()
        started = time.perf_counter()
        try:
            report = await self.index.apply_batch(events)
        except KvIndexError:
            self.metrics.errors.labels("apply").inc()
            raise
        m = self.metrics
        m.apply_seconds.observe(time.perf_counter() - started)
        m.batch_size.observe(len(events))
        now = self._clock()
        self.last_apply_at = now
        # one lag sample per batch: the oldest event, so the histogram's tail is honest
        m.lag_seconds.observe(max(0.0, now - min(e.ts for e in events)))
        m.applied.labels("applied").inc(report.applied)
        m.applied.labels("stale").inc(report.stale)
        m.applied.labels("ignored").inc(report.ignored)
        for backend, count in report.created.items():
            m.changes.labels(m.backend(backend), "created").inc(count)
        for backend, count in report.evicted.items():
            m.changes.labels(m.backend(backend), "evicted").inc(count)
        return report

    def received_blocks(self, batches: Sequence[KvBatch]) -> None:
        m = self.metrics
        per_backend: dict[str, list[int]] = {}
        for batch in batches:
            counts = per_backend.setdefault(batch.backend, [0, 0])
            counts[0] += 1
            counts[1] += batch.block_count
        for backend, (count, blocks) in per_backend.items():
            label = m.backend(backend)
            m.block_batches.labels(label).inc(count)
            m.blocks_received.labels(label).inc(blocks)

    async def apply_blocks(self, batches: Sequence[KvBatch]) -> BlockApplyReport:
        """Apply a pull batch's KV batches (grouped per backend by the index); KvIndexError
        propagates (the transport retries them)."""
        if not batches:
            return BlockApplyReport()
        if self.blocks is None:
            raise RuntimeError("this sink has no block index")
        started = time.perf_counter()
        try:
            report = await self.blocks.apply_batches(batches)
        except KvIndexError:
            self.metrics.errors.labels("apply").inc()
            raise
        m = self.metrics
        m.block_apply_seconds.observe(time.perf_counter() - started)
        now = self._clock()
        self.last_apply_at = now
        for batch in batches:
            m.block_lag_seconds.observe(max(0.0, now - batch.ts))
        m.blocks_applied.labels("applied").inc(report.applied)
        m.blocks_applied.labels("stale").inc(report.stale)
        m.block_batches_stale.inc(report.stale_batches)
        m.block_clears.inc(report.clears)
        m.block_evictions.inc(report.evicted)
        if report.gaps and self.on_gaps is not None:
            await self.on_gaps(report.gaps)
        return report
