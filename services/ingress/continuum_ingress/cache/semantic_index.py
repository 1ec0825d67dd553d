"""The semantic cache's vector index: in memory, one per ingress process (seed: "라우터별
인메모리 구조(max_entries 상한, 오래된 항목부터 제거)").

Vectors are L2-normalised on insert and query, so cosine similarity is a dot product. Rows
live in one preallocated float32 matrix of `max_entries` rows used as a ring: a new entry takes
the oldest slot (oldest first eviction). Each partition digest owns the set of slots holding
its entries, and a query scores only those rows (`matrix[slots] @ q`), so a search costs the
partition's size, not the index's. Entries carry an expiry; expired rows are skipped and freed.
The same entry id inserted again replaces its row (no duplicates).

Pure computation over numpy arrays; no I/O, no locks (the ingress is one event loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class SemanticMatch:
    entry_id: str
    score: float


def normalize(vector: npt.ArrayLike) -> Vector | None:
    """float32 unit vector, or None for an empty, non-finite or zero vector."""
    arr = np.asarray(vector, dtype=np.float32).reshape(-1)
    if arr.size == 0 or not np.all(np.isfinite(arr)):
        return None
    norm = float(np.linalg.norm(arr))
    if norm == 0.0 or not np.isfinite(norm):
        return None
    out: Vector = arr / np.float32(norm)
    return out


class SemanticIndex:
    def __init__(self, max_entries: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._clock = clock
        self._reset(dim=0)

    def _reset(self, dim: int) -> None:
        self.dim = dim
        self._matrix: Vector = np.zeros((self.max_entries if dim else 0, dim), dtype=np.float32)
        self._slot_id: list[str | None] = [None] * self.max_entries
        self._slot_partition: list[str | None] = [None] * self.max_entries
        self._slot_expiry = [0.0] * self.max_entries
        self._partitions: dict[str, dict[int, None]] = {}
        self._by_id: dict[tuple[str, str], int] = {}
        self._next = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def partitions(self) -> int:
        return len(self._partitions)

    def clear(self) -> int:
        removed = self._count
        self._reset(dim=0)
        return removed

    def resize(self, max_entries: int) -> None:
        """Hot reload of `max_entries`: keeps the newest entries that fit."""
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if max_entries == self.max_entries:
            return
        live = self._live_in_age_order()[-max_entries:]
        dim = self.dim
        self.max_entries = max_entries
        self._reset(dim)
        for partition, entry_id, vector, expiry in live:
            self._put(partition, entry_id, vector, expiry)

    def _live_in_age_order(self) -> list[tuple[str, str, Vector, float]]:
        out = []
        for step in range(self.max_entries):
            slot = (self._next + step) % self.max_entries
            entry_id, partition = self._slot_id[slot], self._slot_partition[slot]
            if entry_id is not None and partition is not None:
                out.append((partition, entry_id, self._matrix[slot].copy(), self._slot_expiry[slot]))
        return out

    def _free(self, slot: int) -> None:
        entry_id, partition = self._slot_id[slot], self._slot_partition[slot]
        if entry_id is None or partition is None:
            return
        slots = self._partitions[partition]
        del slots[slot]
        if not slots:
            del self._partitions[partition]
        del self._by_id[(partition, entry_id)]
        self._slot_id[slot] = self._slot_partition[slot] = None
        self._count -= 1

    def add(self, partition: str, entry_id: str, vector: npt.ArrayLike, ttl: float) -> bool:
        """Index `vector` under `partition`. False when the vector is unusable. A vector of
        another dimension (the embedding model changed) empties the index first."""
        unit = normalize(vector)
        if unit is None:
            return False
        if unit.shape[0] != self.dim:
            self._reset(dim=unit.shape[0])
        self._put(partition, entry_id, unit, self._clock() + ttl)
        return True

    def _put(self, partition: str, entry_id: str, unit: Vector, expiry: float) -> None:
        existing = self._by_id.get((partition, entry_id))
        if existing is not None:
            slot = existing
        else:
            slot = self._next
            self._next = (self._next + 1) % self.max_entries
            self._free(slot)  # the oldest entry gives way
            self._slot_id[slot], self._slot_partition[slot] = entry_id, partition
            self._partitions.setdefault(partition, {})[slot] = None
            self._by_id[(partition, entry_id)] = slot
            self._count += 1
        self._matrix[slot] = unit
        self._slot_expiry[slot] = expiry

    def remove(self, partition: str, entry_id: str) -> None:
        slot = self._by_id.get((partition, entry_id))
        if slot is not None:
            self._free(slot)

    def search(self, partition: str, vector: npt.ArrayLike, threshold: float) -> SemanticMatch | None:
        """The most similar live entry of `partition` scoring ≥ threshold, or None."""
        slots_map = self._partitions.get(partition)
        if not slots_map:
            return None
        unit = normalize(vector)
        if unit is None or unit.shape[0] != self.dim:
            return None
        now = self._clock()
        expired = [s for s in slots_map if self._slot_expiry[s] <= now]
        for slot in expired:
            self._free(slot)
        if not expired:
            slots = np.fromiter(slots_map, dtype=np.intp, count=len(slots_map))
        elif partition in self._partitions:
            slots = np.fromiter(self._partitions[partition], dtype=np.intp)
        else:
            return None
        scores = self._matrix[slots] @ unit
        best = int(np.argmax(scores))
        score = float(scores[best])
        if score < threshold:
            return None
        entry_id = self._slot_id[int(slots[best])]
        assert entry_id is not None
        return SemanticMatch(entry_id, score)
