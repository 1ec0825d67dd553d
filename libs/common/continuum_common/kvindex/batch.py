"""Pure batch planning shared by both index backends: split a batch into `cleared` watermarks
and per-prefix entry writes, in a deterministic order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from continuum_common.events import EventType, KvEvent
from continuum_common.kvindex.entry import FieldWrites, TierPolicy, event_stamp, event_writes

# Token counts are stored as Lua numbers (doubles) and printed with %d; anything bigger than
# this is a corrupt event, not a real cache.
MAX_TOKENS = 1 << 40


class EntryWrite(NamedTuple):
    backend: str
    stamp: str
    writes: FieldWrites


@dataclass(slots=True)
class BatchPlan:
    # backend -> newest `cleared` stamp in the batch
    clears: dict[str, str] = field(default_factory=dict)
    # prefix -> writes in stamp order
    entries: dict[str, list[EntryWrite]] = field(default_factory=dict)
    ignored: int = 0

    def backends(self) -> set[str]:
        return {w.backend for writes in self.entries.values() for w in writes}


def plan_batch(events: Sequence[KvEvent], policy: TierPolicy) -> BatchPlan:
    plan = BatchPlan()
    entries = plan.entries
    # stamp order inside a batch only makes the holder-transition counters tidy; the result
    # does not depend on it
    for stamp, event in sorted(((event_stamp(e), e) for e in events), key=itemgetter(0)):
        if event.type is EventType.CLEARED:
            if stamp > plan.clears.get(event.backend, ""):
                plan.clears[event.backend] = stamp
            continue
        writes = event_writes(event, policy)
        if writes is None or event.prefix_hash is None:
            plan.ignored += 1
            continue
        if event.token_count > MAX_TOKENS:
            writes = FieldWrites(
                gpu=min(writes.gpu, MAX_TOKENS) if writes.gpu is not None else None,
                warm=min(writes.warm, MAX_TOKENS) if writes.warm is not None else None,
            )
        entries.setdefault(event.prefix_hash, []).append(EntryWrite(event.backend, stamp, writes))
    return plan
