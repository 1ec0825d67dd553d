"""Per (tier, prefix key): the deepest cached chain, and the normalized events it implies.

Every attributed block contributes its chain depth (tokens from the start of the prompt to the
end of the block) to its prefix key in each tier it is resident in. The deepest contribution is
the `token_count` the index stores (seed: "해당 백엔드에 캐시된 토큰 수"). Contributions are a
multiset (depth → count) with a lazy max-heap, so adding and removing blocks is O(log n) and
the maximum never needs a scan.

Changes are coalesced: `add`/`remove` only mark a key dirty, and `flush()` compares each dirty
key's current depth with the depth last announced for it:

| tier | before → after | event |
|---|---|---|
| gpu_hot | 0 → d | created |
| storage_warm | 0 → d | offloaded |
| either | d → d' (d' ≠ d, both > 0) | updated |
| either | d → 0 | evicted |
| either | unchanged (a block came and went inside one window) | nothing |

So the number of events per window is bounded by the number of distinct keys touched, not by the
number of block events.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from continuum_common.events import EventType, Tier

GPU, STORAGE = 0, 1
TIERS = (Tier.GPU_HOT, Tier.STORAGE_WARM)
_APPEAR = (EventType.CREATED, EventType.OFFLOADED)


@dataclass(frozen=True, slots=True)
class Change:
    type: EventType
    tier: Tier
    prefix: bytes
    token_count: int


class _Entry:
    __slots__ = ("counts", "emitted", "heap")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.heap: list[int] = []  # negated depths; may hold stale values (lazy deletion)
        self.emitted = 0

    def current(self) -> int:
        counts, heap = self.counts, self.heap
        while heap and -heap[0] not in counts:
            heapq.heappop(heap)
        if len(heap) > 2 * len(counts) + 16:  # too many stale values below the top
            self.heap = heap = [-d for d in counts]
            heapq.heapify(heap)
        return -heap[0] if heap else 0


class DepthBook:
    """Deepest chain per (tier, prefix); see the module docstring."""

    def __init__(self) -> None:
        self._entries: tuple[dict[bytes, _Entry], dict[bytes, _Entry]] = ({}, {})
        self._dirty: dict[tuple[int, bytes], None] = {}

    def __len__(self) -> int:
        return len(self._entries[GPU]) + len(self._entries[STORAGE])

    @property
    def dirty(self) -> int:
        return len(self._dirty)

    def add(self, tier: int, prefix: bytes, depth: int) -> None:
        entries = self._entries[tier]
        entry = entries.get(prefix)
        if entry is None:
            entry = entries[prefix] = _Entry()
        count = entry.counts.get(depth)
        if count is None:
            entry.counts[depth] = 1
            heapq.heappush(entry.heap, -depth)
        else:
            entry.counts[depth] = count + 1
        self._dirty[(tier, prefix)] = None

    def remove(self, tier: int, prefix: bytes, depth: int) -> None:
        entry = self._entries[tier].get(prefix)
        if entry is None:
            return
        count = entry.counts.get(depth)
        if count is None:
            return
        if count == 1:
            del entry.counts[depth]
        else:
            entry.counts[depth] = count - 1
        self._dirty[(tier, prefix)] = None

    def depth(self, tier: int, prefix: bytes) -> int:
        entry = self._entries[tier].get(prefix)
        return entry.current() if entry else 0

    def flush(self) -> list[Change]:
        changes: list[Change] = []
        dirty, self._dirty = self._dirty, {}
        for tier, prefix in dirty:
            entries = self._entries[tier]
            entry = entries.get(prefix)
            if entry is None:
                continue
            now, before = entry.current(), entry.emitted
            if not entry.counts:
                del entries[prefix]
            if now == before:
                continue
            if before == 0:
                kind = _APPEAR[tier]
            elif now == 0:
                kind = EventType.EVICTED
            else:
                kind = EventType.UPDATED
            entry.emitted = now
            changes.append(Change(kind, TIERS[tier], prefix, now))
        return changes

    def snapshot(self) -> list[Change]:
        """What has been announced so far, as appearance events (for a consumer that starts
        from nothing: an SSE client without a usable Last-Event-ID, a resync)."""
        out: list[Change] = []
        for tier, entries in enumerate(self._entries):
            for prefix, entry in entries.items():
                if entry.emitted:
                    out.append(Change(_APPEAR[tier], TIERS[tier], prefix, entry.emitted))
        return out

    def forget_announced(self) -> None:
        """Consumers lost our announcements (a `cleared` went out without a restatement): treat
        every key as never announced, so its next change is announced as an appearance."""
        for entries in self._entries:
            for entry in entries.values():
                entry.emitted = 0

    def clear(self) -> None:
        self._entries = ({}, {})
        self._dirty = {}
