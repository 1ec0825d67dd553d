"""One source's processing: decoded engine events → what the source publishes.

* Blocks (`publish: blocks | both`): each engine batch becomes one version-2 block batch
  (protocol.blocks maps vLLM / SGLang events, policy.rekey re-keys TensorRT-LLM blocks by
  content), numbered and published by the source's BlockStream.
* Prefix keys (`publish: prefix | both`): chain tracker → coalesced version-1 normalized events,
  numbered by the source's EventSequencer and handed to every sink (the JetStream publisher, the
  SSE hub). Detokenize jobs go to a bounded queue served by `detokenize_concurrency` workers; a
  full queue leaves the blocks OPEN for a later retry (counted). A blocks-only source never
  builds a chain tracker or a detokenize worker.

Both streams of a source share its `source_epoch`: every new epoch restarts both. Transport
adapters (ZMQ, TRT-LLM poller) call into a SourcePipeline synchronously; it never blocks. Before
reading more from its engine an adapter awaits `wait_room()` (publisher backpressure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from continuum_common.config.listener import ListenerSource
from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.logs import short_hash
from continuum_listener.attribution import Resolver
from continuum_listener.block_stream import BatchSink, BlockStream
from continuum_listener.errors import DecodeError
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.policy.chains import ChainTracker, Job, Limits, Mode, Outcome, Resolution
from continuum_listener.policy.depths import DepthBook
from continuum_listener.policy.rekey import Rekeyer
from continuum_listener.policy.resident import ResidentBlocks
from continuum_listener.policy.sequence import EventSequencer
from continuum_listener.protocol.blocks import BlockMapper, EventBuilder
from continuum_listener.protocol.engine import decode_batch
from continuum_listener.protocol.fast_blocks import decode_into
from continuum_listener.protocol.model import Batch, Cleared, EngineEvent, Moved, Removed, Stored

log = logging.getLogger("continuum.listener")
MAX_RANKS = 64
_FAST_MISSES = 16  # consecutive batches the fast decoder refused before a source stops trying it


class EventSink(Protocol):
    def submit(self, event: KvEvent) -> None: ...


class FlowControl(Protocol):
    """The publisher's backpressure, as sources see it."""

    @property
    def blocked(self) -> bool: ...

    async def wait_room(self) -> None: ...


@dataclass(slots=True)
class SourceStats:
    """What the heartbeat reports for one source."""

    connected: bool = False
    received: int = 0  # engine events applied
    dropped: int = 0
    last_event_at: float | None = None
    reconnects: int = 0
    mismatches: int = 0


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    limits: Limits
    coalesce_window: float  # seconds; 0 = flush after every batch
    max_prefix_length: int
    secret: bytes | None
    detokenize_concurrency: int = 4
    detokenize_queue: int = 1024
    keepalive: float = 60.0  # seconds without a block batch before an empty one is sent


class SourcePipeline:
    def __init__(
        self,
        source: ListenerSource,
        settings: PipelineSettings,
        metrics: ListenerMetrics,
        sinks: Sequence[EventSink],
        resolver: Resolver | None = None,
        *,
        block_sink: BatchSink | None = None,
        flow: FlowControl | None = None,
    ) -> None:
        self.source = source
        self.backend = source.backend_name
        self.settings = settings
        self.metrics = metrics
        self.prefix = source.publishes_prefix
        self.sinks = list(sinks) if self.prefix else []
        self.resolver = resolver if self.prefix else None
        self.book = DepthBook()
        self.sequencer = EventSequencer(self.backend)
        self.stats = SourceStats()
        self.trackers: dict[int, ChainTracker] = {}
        mode: Mode = source.prefix_key_mode
        self._mode = mode
        self._jobs: asyncio.Queue[tuple[ChainTracker, Job]] = asyncio.Queue(settings.detokenize_queue)
        self._warned_mismatch = False
        # Label children resolved once: `labels()` costs more than the increment on the hot path.
        self._m_batches = metrics.batches.labels(self.backend)
        self._m_kinds = {
            k: metrics.block_events.labels(self.backend, k) for k in ("stored", "removed", "moved", "cleared")
        }
        self._m_pauses = metrics.pauses.labels(self.backend)
        self._m_paused = metrics.paused_seconds.labels(self.backend)
        self._resync_wanted = False
        self.flow = flow
        # Block output (None for a prefix-only source, or when there is no bus to publish to).
        self.blocks: BlockStream | None = None
        if source.publishes_blocks and block_sink is not None:
            # TensorRT-LLM blocks are restated by their re-key maps; the others need their own.
            resident = None if source.engine == "trtllm" else ResidentBlocks(settings.limits.max_tracked_blocks)
            self.blocks = BlockStream(
                self.backend, block_sink, metrics, keepalive=settings.keepalive, resident=resident
            )
        self.mapper = BlockMapper(source.block_size)
        self.rekeyers: dict[int, Rekeyer] = {}
        self._pending = EventBuilder()
        self._skipped: dict[str, int] = {}
        # Blocks only: try the fast decoder first (a prefix-key source needs the generic one).
        self._fast = not self.prefix
        self._fast_misses = 0
        self.replay_wanted = False  # a resync asks the ZMQ source to replay the engine's buffer

    # -- trackers and numbering ----------------------------------------------------------------

    def tracker(self, rank: int = 0) -> ChainTracker:
        tracker = self.trackers.get(rank)
        if tracker is None:
            tracker = self.trackers[rank] = ChainTracker(
                backend=self.backend,
                book=self.book,
                mode=self._mode,
                secret=self.settings.secret,
                detokenize=self.resolver is not None,
                limits=self.settings.limits,
            )
        return tracker

    def rekeyer(self, rank: int = 0) -> Rekeyer:
        rekeyer = self.rekeyers.get(rank)
        if rekeyer is None:
            capacity = self.settings.limits.max_tracked_blocks
            rekeyer = self.rekeyers[rank] = Rekeyer(capacity, self.source.block_size)
        return rekeyer

    def _emit(self, kind: EventType, prefix: bytes | None, tier: Tier, count: int) -> KvEvent:
        event = self.sequencer.make(kind, prefix, tier, count)
        self.metrics.published.labels(self.backend, kind.value).inc()
        for sink in self.sinks:
            sink.submit(event)
        return event

    def start_epoch(self, reason: str) -> None:
        """A new source_epoch: `cleared` (prefix keys) and a batch holding AllCleared (blocks)
        first, so consumers drop what they knew."""
        for tracker in self.trackers.values():
            tracker.reset()
        self.book.clear()
        epoch = self.sequencer.new_epoch()
        self.metrics.epoch(self.backend, reason)
        log.info("source %s: epoch %d (%s)", self.backend, epoch, reason)
        if self.prefix:
            self._emit(EventType.CLEARED, None, Tier.GPU_HOT, 0)
        self._start_block_epoch(epoch)

    def _start_block_epoch(self, epoch: int) -> None:
        for rekeyer in self.rekeyers.values():
            rekeyer.clear()
        self._pending = EventBuilder()
        if self.blocks is not None:
            self.blocks.start_epoch(epoch)

    def clear(self) -> None:
        """AllBlocksCleared (prefix keys): same epoch, everything gone."""
        for tracker in self.trackers.values():
            tracker.reset()
        self.book.clear()
        self._emit(EventType.CLEARED, None, Tier.GPU_HOT, 0)

    def reset_rank(self, rank: int) -> None:
        """One TRT-LLM attention-DP rank restarted or lost events: withdraw only its blocks."""
        tracker = self.trackers.get(rank)
        if tracker is not None:
            tracker.withdraw()
            self._after_change(tracker, flush=False)
        if self.blocks is not None and rank in self.rekeyers:
            self._withdraw_rank(rank)

    def _withdraw_rank(self, rank: int) -> None:
        """Block output for a rank that lost its state: AllCleared when it is the source's only
        rank (cheaper, and covers blocks the re-key map forgot), else that rank's removals."""
        if set(self.rekeyers) <= {rank}:
            self.rekeyer(rank).clear()
            self._pending.cleared()
        else:
            self.rekeyer(rank).withdraw(self._pending)

    # -- input -------------------------------------------------------------------------------

    def apply_payload(self, payload: bytes) -> None:
        """Decode one vLLM/SGLang payload frame and apply it (counted drop when malformed)."""
        if self._fast and self.blocks is not None:
            try:
                if self._apply_fast(payload):
                    return
            except Exception:  # a bug must not stop the source: count, log (no payload), go on
                self._pending = EventBuilder()
                self._skipped.clear()
                self.drop("other")
                log.exception("source %s: failed to apply a batch of %d bytes", self.backend, len(payload))
                return
        try:
            batch = decode_batch(payload, block_size=self.source.block_size)
        except DecodeError as exc:
            self.drop(exc.reason)
            return
        try:
            self.apply_batch(batch)
        except Exception:  # a bug must not stop the source: count, log (no payload), go on
            self._pending = EventBuilder()
            self.drop("other")
            log.exception("source %s: failed to apply a batch of %d events", self.backend, len(batch.events))

    def _apply_fast(self, payload: bytes) -> bool:
        """Blocks only: vLLM's map-encoded batches straight to block events (protocol.fast_blocks).
        A source whose batches it keeps refusing (another era, SGLang) stops trying."""
        fast = decode_into(payload, self.mapper, self._pending, self._skipped)
        if fast is None:
            self._fast_misses += 1
            self._fast = self._fast_misses < _FAST_MISSES
            return False
        self._fast_misses = 0
        self._m_batches.inc()
        for name, n in (("stored", fast.stored), ("removed", fast.removed), ("cleared", fast.cleared)):
            if n:
                self._m_kinds[name].inc(n)
        for _ in range(fast.mismatches):
            self._mismatch()
        self.stats.received += fast.events
        self.stats.last_event_at = time.time()
        self.end_batch()
        return True

    def apply_batch(self, batch: Batch) -> None:
        self._m_batches.inc()
        for reason, n in batch.skipped.items():
            self.drop(reason, n)
        if batch.unknown_fields:
            self.metrics.unknown_fields.labels(self.backend).inc(batch.unknown_fields)
        if self.blocks is not None:
            self.mapper.map(batch.events, self._pending, self._skipped)
        try:
            if self.prefix:
                self.apply_events(self.tracker(0), batch.events, rank_scoped=False)
            else:
                self._account(batch.events, mismatches=True)
        finally:  # the block batch goes out even if the prefix path failed on it
            self.end_batch()

    def apply_rank(self, rank: int, events: Sequence[EngineEvent]) -> None:
        """TensorRT-LLM: one rank's events; the caller ends the body with `end_batch()`."""
        if self.prefix:
            self.apply_events(self.tracker(rank), events, rank_scoped=True)
        else:
            self._account(events, mismatches=True)
        if self.blocks is None:
            return
        rekeyer, out, skipped = self.rekeyer(rank), self._pending, self._skipped
        for event in events:
            if isinstance(event, Stored):
                rekeyer.stored(event, out, skipped)
            elif isinstance(event, Removed):
                rekeyer.removed(event, out, skipped)
            elif isinstance(event, Moved):
                rekeyer.moved(event, out, skipped)
            else:
                self._withdraw_rank(rank)
        pruned = rekeyer.take_pruned()
        if pruned:
            self.metrics.chain_event(self.backend, "pruned_blocks", pruned)

    def apply_events(self, tracker: ChainTracker, events: Sequence[EngineEvent], *, rank_scoped: bool) -> None:
        """Apply events to a chain tracker (prefix keys); the caller ends the batch with
        `end_batch()` (one flush per batch)."""
        for event in events:
            if type(event) is Stored:
                if event.mismatch:
                    self._mismatch()
                self._submit(tracker, tracker.apply_stored(event))
            elif type(event) is Removed:
                tracker.apply_removed(event)
            elif type(event) is Moved:
                tracker.apply_moved(event)
            else:
                assert type(event) is Cleared
                if rank_scoped:
                    tracker.withdraw()
                else:
                    self.clear()
        self._account(events, mismatches=False)
        self._after_change(tracker, flush=False)

    def _account(self, events: Sequence[EngineEvent], *, mismatches: bool) -> None:
        """Engine events by kind and the source's stats (`mismatches`: also count stores whose
        tokens do not match their block size; the prefix path counts them itself)."""
        kinds: dict[type, int] = {}
        for event in events:
            kind = type(event)
            kinds[kind] = kinds.get(kind, 0) + 1
            if mismatches and kind is Stored and event.mismatch:  # type: ignore[union-attr]
                self._mismatch()
        for kind, n in kinds.items():
            self._m_kinds[_KIND_NAMES[kind]].inc(n)
        self.stats.received += len(events)
        self.stats.last_event_at = time.time()

    def end_batch(self) -> None:
        if self.prefix and self.settings.coalesce_window <= 0:
            self.flush()
        if self._skipped:
            for reason, n in self._skipped.items():
                self.drop(reason, n)
            self._skipped.clear()
        if self.blocks is not None and len(self._pending):
            pending, self._pending = self._pending, EventBuilder()
            self.blocks.emit(pending)

    def drop(self, reason: str, n: int = 1) -> None:
        self.stats.dropped += n
        self.metrics.drop(self.backend, reason, n)

    def _mismatch(self) -> None:
        self.stats.mismatches += 1
        self.metrics.mismatch.labels(self.backend).inc()
        if not self._warned_mismatch:
            self._warned_mismatch = True
            log.warning(
                "source %s: a stored event's token count does not match its block_size; such "
                "blocks are tracked without tokens (warned once per source)",
                self.backend,
            )

    def _after_change(self, tracker: ChainTracker, *, flush: bool = True) -> None:
        for what, n in tracker.drain_counts().items():
            self.metrics.chain_event(self.backend, what, n)
        if flush and self.settings.coalesce_window <= 0:
            self.flush()

    # -- backpressure --------------------------------------------------------------------------

    async def wait_room(self) -> None:
        """Return once the publisher can take more (at once when it can)."""
        flow = self.flow
        if flow is None or not flow.blocked:
            return
        self._m_pauses.inc()
        started = time.monotonic()
        await flow.wait_room()
        self._m_paused.inc(time.monotonic() - started)

    # -- detokenize ----------------------------------------------------------------------------

    def _submit(self, tracker: ChainTracker, jobs: list[Job]) -> None:
        for job in jobs:
            try:
                self._jobs.put_nowait((tracker, job))
            except asyncio.QueueFull:
                self.metrics.detok(self.backend, "queue_full")
                tracker.resolve(job, Resolution(Outcome.FAILED))

    async def _detokenize_worker(self) -> None:
        assert self.resolver is not None
        while True:
            tracker, job = await self._jobs.get()
            if tracker.materialize(job):
                resolution = await self.resolver.resolve(job)
                job.tokens = None
            else:
                resolution = Resolution(Outcome.FAILED)
            follow = tracker.resolve(job, resolution)
            self._submit(tracker, follow)
            self._after_change(tracker)

    @property
    def jobs_waiting(self) -> int:
        return self._jobs.qsize()

    # -- output ----------------------------------------------------------------------------------

    def flush(self) -> list[KvEvent]:
        events = [self._emit(c.type, c.prefix, c.tier, c.token_count) for c in self.book.flush()]
        if events and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "source %s: %d events, last %s", self.backend, len(events), short_hash(events[-1].prefix_hash or "")
            )
        self.metrics.tracked_blocks.labels(self.backend).set(sum(len(t.blocks) for t in self.trackers.values()))
        self.metrics.retained_tokens.labels(self.backend).set(sum(t.retained_tokens for t in self.trackers.values()))
        self.metrics.prefixes.labels(self.backend).set(len(self.book))
        return events

    def snapshot(self) -> list[KvEvent]:
        """The announced state as appearance events stamped with the current (epoch, seq)."""
        seq, epoch = self.sequencer.seq, self.sequencer.epoch
        return [
            KvEvent(self.backend, epoch, seq, time.time(), c.type, c.prefix.hex(), c.token_count, c.tier)
            for c in self.book.snapshot()
        ]

    def want_resync(self) -> None:
        """The publisher lost messages of this backend: restate everything in a new epoch."""
        self._resync_wanted = True

    def resync(self, room: int) -> bool:
        """New epoch; prefix keys: `cleared`, then the announced state (when it fits in `room`
        events); blocks: AllCleared, then the re-keyed TensorRT-LLM blocks, or for a ZMQ source
        the blocks its published events left resident and a replay of the engine's buffer
        (`replay_wanted`, served by the ZMQ source) for whatever the listener itself missed."""
        if not self._resync_wanted:
            return False
        self._resync_wanted = False
        state = self.book.snapshot()
        epoch = self.sequencer.new_epoch()
        self.metrics.epoch(self.backend, "resync")
        log.warning("source %s: resync in epoch %d (%d prefixes)", self.backend, epoch, len(state))
        if self.prefix:
            self._emit(EventType.CLEARED, None, Tier.GPU_HOT, 0)
            if len(state) < room:
                for change in state:
                    self._emit(change.type, change.prefix, change.tier, change.token_count)
            else:  # restating would overflow again: announce keys afresh as they change
                self.book.forget_announced()
        if self.blocks is not None:
            self._pending = EventBuilder()
            self.blocks.start_epoch(epoch, restate=self.source.engine != "trtllm")
            if self.source.engine == "trtllm":
                restated = EventBuilder()
                for rekeyer in self.rekeyers.values():
                    rekeyer.restate(restated)
                self.blocks.emit(restated)
            else:
                self.replay_wanted = True
        return True

    @property
    def resync_wanted(self) -> bool:
        return self._resync_wanted

    async def run(self) -> None:
        """Flush timer, block keepalives and detokenize workers; runs until cancelled."""
        async with asyncio.TaskGroup() as tg:
            if self.resolver is not None:
                for _ in range(self.settings.detokenize_concurrency):
                    tg.create_task(self._detokenize_worker())
            if self.blocks is not None:
                tg.create_task(self._keepalive(self.blocks))
            if self.prefix:
                window = self.settings.coalesce_window
                while True:
                    await asyncio.sleep(window if window > 0 else 1.0)
                    self.flush()

    async def _keepalive(self, blocks: BlockStream) -> None:
        while True:
            due = blocks.keepalive_due(time.monotonic())
            if due > 0:
                await asyncio.sleep(due)
                continue
            if self.stats.connected:
                blocks.send_keepalive()
            else:  # an engine that is gone is left to expire in the index
                await asyncio.sleep(min(blocks.keepalive, 1.0))


_KIND_NAMES: dict[type, str] = {Stored: "stored", Removed: "removed", Moved: "moved", Cleared: "cleared"}
