"""What the service's state store answers. The records it keeps per (backend, digest), and
their JSON form, are part of the wire contract (continuum_common.wire.gemini)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from continuum_common.wire.gemini import Entry, NegativeEntry

__all__ = ["Counts", "Entry", "Found", "LookupState", "NegativeEntry", "Removal", "Removed"]


class Found(StrEnum):
    HIT = "hit"
    MISS = "miss"
    NEGATIVE = "negative"


@dataclass(frozen=True, slots=True)
class LookupState:
    found: Found
    entry: Entry | None = None
    negative: NegativeEntry | None = None
    in_flight: bool = False  # a create lock is held for this id (any replica)
    expired: Entry | None = None  # an entry that this read found expired and removed


class Removal(StrEnum):
    EVICTED = "evicted"  # LRU, over max_entries: DELETE it at Google
    EXPIRED = "expired"  # past its expiry: Google already dropped it
    REPLACED = "replaced"  # the same id got a new resource: DELETE the old one


@dataclass(frozen=True, slots=True)
class Removed:
    reason: Removal
    entry: Entry | None = None
    negative: NegativeEntry | None = None

    @property
    def backend(self) -> str:
        record = self.entry or self.negative
        return record.backend if record is not None else ""


@dataclass(frozen=True, slots=True)
class Counts:
    entries: int
    negative_entries: int
    in_flight: int
    per_backend: dict[str, tuple[int, int]]  # backend -> (entries, negative entries)
