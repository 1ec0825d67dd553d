"""One source's version-2 output: block events → numbered KvBatch messages (wire/kv.py).

* One batch per engine batch (a batch whose events were all filtered out publishes nothing);
  a batch over the wire bounds or the bus's message size is split into consecutive batches.
* `seq` counts batches from 1 within the source's epoch; every epoch starts with a batch whose
  only event is AllCleared (published at once, so consumers drop what they knew promptly).
* Keepalive: a stream that published nothing for `keepalive` seconds while its engine is
  connected gets an empty batch — the block index takes batches as the backend's liveness, and
  an engine that stops talking is left to expire there.
* `ts` is the listener's clock at publication.
* With a `resident` set (policy/resident.py), what the published events leave resident is kept,
  so a resync can restate it in a new epoch (`start_epoch(restate=True)`).
"""

from __future__ import annotations

import time
from typing import Protocol

from continuum_common.wire.kv import AllCleared, BlockEvent, BlocksRemoved, BlocksStored, KvBatch
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.policy.resident import ResidentBlocks
from continuum_listener.protocol.blocks import EventBuilder, max_hashes_for, split


class BatchSink(Protocol):
    """Where a block stream's batches go (the JetStream publisher)."""

    @property
    def max_payload(self) -> int: ...

    def submit_batch(self, batch: KvBatch) -> None: ...


class BlockStream:
    def __init__(
        self,
        backend: str,
        sink: BatchSink,
        metrics: ListenerMetrics,
        *,
        keepalive: float,
        resident: ResidentBlocks | None = None,
    ) -> None:
        self.backend = backend
        self.sink = sink
        self.keepalive = keepalive
        # What the engine holds per the events published so far (restated by a resync).
        self.resident = resident
        self.epoch = 0
        self.seq = 0
        self.last_published = time.monotonic()
        self._m_batches = metrics.block_batches.labels(backend)
        self._m_keepalives = metrics.keepalives.labels(backend)
        self._m_stored = metrics.blocks.labels(backend, "stored")
        self._m_removed = metrics.blocks.labels(backend, "removed")
        self._m_cleared = metrics.blocks.labels(backend, "cleared")

    def start_epoch(self, epoch: int, *, restate: bool = False) -> None:
        """A new epoch begins with AllCleared. With `restate`, the blocks the engine still holds
        follow at once (a resync: the engine lost nothing, a consumer did)."""
        held = self.resident.restate() if restate and self.resident is not None else []
        self.epoch = epoch
        self.seq = 0
        self.publish([AllCleared()])
        if held:
            self.publish(held)

    def emit(self, builder: EventBuilder) -> None:
        if len(builder):
            self.publish(builder.build())

    def publish(self, events: list[BlockEvent]) -> None:
        if self.resident is not None and events:
            self.resident.apply(events)
        chunks = split(events, max_hashes_for(self.sink.max_payload)) if events else [[]]
        now = time.time()
        for chunk in chunks:
            self.seq += 1
            self.sink.submit_batch(KvBatch(self.backend, self.epoch, self.seq, now, chunk))
            self._m_batches.inc()
        stored = removed = cleared = 0
        for event in events:
            if isinstance(event, BlocksStored):
                stored += len(event.hashes)
            elif isinstance(event, BlocksRemoved):
                removed += len(event.hashes)
            else:
                cleared += 1
        if stored:
            self._m_stored.inc(stored)
        if removed:
            self._m_removed.inc(removed)
        if cleared:
            self._m_cleared.inc(cleared)
        self.last_published = time.monotonic()

    def keepalive_due(self, now: float) -> float:
        """Seconds until the next keepalive is due (≤ 0: due now)."""
        return self.last_published + self.keepalive - now

    def send_keepalive(self) -> None:
        self.publish([])
        self._m_keepalives.inc()
