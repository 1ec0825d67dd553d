"""Sequence decisions: engine seq / event_id continuity in, and the listener's own
(source_epoch, seq) numbering out."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from continuum_common.events import EventType, KvEvent, Tier


class SeqAction(Enum):
    APPLY = "apply"  # the next batch in order
    JOIN = "join"  # first batch seen and it is not seq 0: history before it may be replayable
    GAP = "gap"  # batches [expected, seq) were lost in transit: replay them
    RESTART = "restart"  # seq went backwards: the publisher restarted
    DUPLICATE = "duplicate"  # already applied from a replay that ran ahead of the live feed


@dataclass(frozen=True, slots=True)
class SeqDecision:
    action: SeqAction
    missing_from: int = 0  # first seq to replay (JOIN, GAP, RESTART with seq > 0)


class SeqTracker:
    """ZMQ publisher seq continuity for one source (kv-events-spec §5.1)."""

    def __init__(self) -> None:
        self.last: int | None = None
        # Seqs a tail replay applied before their live copies arrived: (first, last).
        self._replayed: tuple[int, int] | None = None

    def observe(self, seq: int) -> SeqDecision:
        last = self.last
        if self._replayed is not None:
            first, through = self._replayed
            if first <= seq <= through:
                return SeqDecision(SeqAction.DUPLICATE)
            self._replayed = None
        if last is None:
            return SeqDecision(SeqAction.APPLY) if seq == 0 else SeqDecision(SeqAction.JOIN, 0)
        if seq == last + 1:
            return SeqDecision(SeqAction.APPLY)
        if seq > last + 1:
            return SeqDecision(SeqAction.GAP, last + 1)
        return SeqDecision(SeqAction.RESTART, 0)

    def advance(self, seq: int) -> None:
        self.last = seq

    def replayed(self, first: int, through: int) -> None:
        """A replay without an end bound applied [first, through]: their live copies, still on
        their way, are duplicates (until a seq outside that range arrives)."""
        self._replayed = (first, through)

    def forget(self) -> None:
        self.last = None
        self._replayed = None


class IdAction(Enum):
    APPLY = "apply"
    DUPLICATE = "duplicate"  # already applied (a re-delivered response)
    GAP = "gap"  # ids were skipped: the rank's state is no longer trustworthy
    RESET = "reset"  # `created` or an id back at 0: the rank restarted


class EventIdTracker:
    """TensorRT-LLM event_id continuity, per attention-DP rank (kv-events-spec §3.2)."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}

    def observe(self, rank: int, event_id: int, created: bool) -> IdAction:
        last = self.last.get(rank)
        if created or (event_id == 0 and last is not None and last > 0):
            action = IdAction.RESET
        elif last is None or event_id == last + 1:
            action = IdAction.APPLY
        elif event_id <= last:
            return IdAction.DUPLICATE
        else:
            action = IdAction.GAP
        self.last[rank] = event_id
        return action


class EventSequencer:
    """Numbers a backend's normalized events: `seq` counts from 1 within a `source_epoch`, and a
    new epoch (milliseconds since the Unix epoch, strictly increasing) starts when the listener
    starts and whenever the engine's own sequence restarted or could not be recovered."""

    def __init__(self, backend: str, clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self._clock = clock
        self.epoch = 0
        self.seq = 0

    def new_epoch(self) -> int:
        self.epoch = max(int(self._clock() * 1000), self.epoch + 1)
        self.seq = 0
        return self.epoch

    def make(self, kind: EventType, prefix: bytes | None, tier: Tier, token_count: int) -> KvEvent:
        self.seq += 1
        return KvEvent(
            backend=self.backend,
            source_epoch=self.epoch,
            seq=self.seq,
            ts=self._clock(),
            type=kind,
            prefix_hash=prefix.hex() if prefix is not None else None,
            token_count=token_count,
            tier=tier,
        )
