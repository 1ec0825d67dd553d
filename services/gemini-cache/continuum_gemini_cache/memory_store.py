"""In-process state for the embedded mode (one gemini-cache in one process). Same behaviour as
the Redis store; bounded by max_entries like it."""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping

from continuum_gemini_cache.model import (
    Counts,
    Entry,
    Found,
    LookupState,
    NegativeEntry,
    Removal,
    Removed,
)

_Record = Entry | NegativeEntry


def _expiry(record: _Record) -> float:
    return record.expire_at if isinstance(record, Entry) else record.until


def _member(record: _Record) -> str:
    return ("e:" if isinstance(record, Entry) else "n:") + record.id


class MemoryStore:
    kind = "memory"

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._negatives: dict[str, NegativeEntry] = {}
        # LRU order over both kinds: first = least recently used. Values: last use time.
        self._lru: OrderedDict[str, float] = OrderedDict()
        # (expiry, member) heap with lazy deletion, so expired records are pruned first.
        self._expiry: list[tuple[float, str]] = []
        self._create_locks: dict[str, tuple[str, float]] = {}
        self._extend_locks: dict[str, tuple[str, float]] = {}
        self._counters: Counter[str] = Counter()

    # ---------------------------------------------------------------- records

    def _get(self, member: str) -> _Record | None:
        kind, _, rid = member.partition(":")
        return self._entries.get(rid) if kind == "e" else self._negatives.get(rid)

    def _remove(self, member: str) -> _Record | None:
        kind, _, rid = member.partition(":")
        record: _Record | None = self._entries.pop(rid, None) if kind == "e" else self._negatives.pop(rid, None)
        self._lru.pop(member, None)
        return record

    def _insert(self, record: _Record, now: float) -> None:
        if isinstance(record, Entry):
            self._entries[record.id] = record
        else:
            self._negatives[record.id] = record
        member = _member(record)
        self._lru[member] = now
        self._lru.move_to_end(member)
        heapq.heappush(self._expiry, (_expiry(record), member))
        if len(self._expiry) > 4 * max(len(self._lru), 256):
            self._compact()

    def _compact(self) -> None:
        """Drop heap items of removed or re-timed records (lazy deletion leaves them behind)."""
        records: list[_Record] = [*self._entries.values(), *self._negatives.values()]
        live = [(_expiry(r), _member(r)) for r in records]
        heapq.heapify(live)
        self._expiry = live

    @staticmethod
    def _removed(reason: Removal, record: _Record) -> Removed:
        if isinstance(record, Entry):
            return Removed(reason, entry=record)
        return Removed(reason, negative=record)

    async def lookup(self, backend: str, digest: str, now: float, *, touch: bool) -> LookupState:
        rid = f"{backend}:{digest}"
        expired: Entry | None = None
        entry = self._entries.get(rid)
        if entry is not None:
            if entry.expire_at > now:
                member = "e:" + rid
                if touch:
                    self._lru[member] = now
                    self._lru.move_to_end(member)
                last_use = self._lru.get(member, 0.0)
                return LookupState(Found.HIT, entry=dataclasses.replace(entry, last_use=last_use))
            self._remove("e:" + rid)
            expired = entry
        negative = self._negatives.get(rid)
        if negative is not None:
            if negative.until > now:
                return LookupState(Found.NEGATIVE, negative=negative)
            self._remove("n:" + rid)
        return LookupState(Found.MISS, in_flight=self._lock_held(self._create_locks, rid), expired=expired)

    def _make_room(self, now: float, max_entries: int, member: str) -> list[Removed]:
        removed: list[Removed] = []
        old = self._remove(member)
        other = self._remove(("n:" if member[0] == "e" else "e:") + member[2:])
        for record in (old, other):
            if isinstance(record, Entry):
                removed.append(Removed(Removal.REPLACED, entry=record))
        if len(self._lru) >= max_entries:
            removed.extend(self._prune(now, len(self._lru)))
        while len(self._lru) >= max_entries:
            victim, _ = self._lru.popitem(last=False)
            record = self._remove(victim)
            if record is not None:
                removed.append(self._removed(Removal.EVICTED, record))
        return removed

    async def put_entry(self, entry: Entry, now: float, max_entries: int) -> list[Removed]:
        removed = self._make_room(now, max_entries, _member(entry))
        self._insert(entry, now)
        return removed

    async def put_negative(self, negative: NegativeEntry, now: float, max_entries: int) -> list[Removed]:
        removed = self._make_room(now, max_entries, _member(negative))
        self._insert(negative, now)
        return removed

    def _prune(self, now: float, limit: int) -> list[Removed]:
        removed: list[Removed] = []
        while self._expiry and self._expiry[0][0] <= now and len(removed) < limit:
            at, member = heapq.heappop(self._expiry)
            record = self._get(member)
            if record is None or _expiry(record) != at:
                continue  # stale heap item: the record was removed or its expiry moved
            self._remove(member)
            removed.append(self._removed(Removal.EXPIRED, record))
        return removed

    async def prune_expired(self, now: float, limit: int) -> list[Removed]:
        return self._prune(now, limit)

    async def update_expiry(self, entry: Entry, expire_at: float, ttl_seconds: float) -> bool:
        rid = entry.id
        current = self._entries.get(rid)
        if current is None or current.name != entry.name:
            return False
        updated = dataclasses.replace(current, expire_at=expire_at, ttl_seconds=ttl_seconds)
        self._entries[rid] = updated
        heapq.heappush(self._expiry, (expire_at, "e:" + rid))
        return True

    async def drop(self, backend: str, digest: str, name: str) -> Entry | None:
        entry = self._entries.get(f"{backend}:{digest}")
        if entry is None or entry.name != name:
            return None
        self._remove("e:" + entry.id)
        return entry

    async def clear(self) -> tuple[list[Entry], int]:
        entries, negatives = list(self._entries.values()), len(self._negatives)
        self._entries.clear()
        self._negatives.clear()
        self._lru.clear()
        self._expiry.clear()
        return entries, negatives

    # ---------------------------------------------------------------- locks

    @staticmethod
    def _lock_held(locks: dict[str, tuple[str, float]], rid: str) -> bool:
        held = locks.get(rid)
        if held is None:
            return False
        if held[1] <= time.monotonic():
            del locks[rid]
            return False
        return True

    def _acquire(self, locks: dict[str, tuple[str, float]], rid: str, token: str, ttl_ms: int) -> bool:
        if self._lock_held(locks, rid):
            return False
        locks[rid] = (token, time.monotonic() + ttl_ms / 1000)
        return True

    @staticmethod
    def _release(locks: dict[str, tuple[str, float]], rid: str, token: str) -> None:
        held = locks.get(rid)
        if held is not None and held[0] == token:
            del locks[rid]

    async def acquire_create_lock(self, backend: str, digest: str, token: str, ttl_ms: int) -> bool:
        return self._acquire(self._create_locks, f"{backend}:{digest}", token, ttl_ms)

    async def release_create_lock(self, backend: str, digest: str, token: str) -> None:
        self._release(self._create_locks, f"{backend}:{digest}", token)

    async def acquire_extend_lock(self, backend: str, digest: str, token: str, ttl_ms: int) -> bool:
        return self._acquire(self._extend_locks, f"{backend}:{digest}", token, ttl_ms)

    # ---------------------------------------------------------------- counts and counters

    async def counts(self) -> Counts:
        per: dict[str, list[int]] = {}
        for entry in self._entries.values():
            per.setdefault(entry.backend, [0, 0])[0] += 1
        for negative in self._negatives.values():
            per.setdefault(negative.backend, [0, 0])[1] += 1
        in_flight = sum(1 for rid in list(self._create_locks) if self._lock_held(self._create_locks, rid))
        return Counts(
            entries=len(self._entries),
            negative_entries=len(self._negatives),
            in_flight=in_flight,
            per_backend={b: (v[0], v[1]) for b, v in per.items()},
        )

    async def add_counters(self, deltas: Mapping[str, int]) -> None:
        self._counters.update(deltas)

    async def read_counters(self) -> dict[str, int]:
        return dict(self._counters)

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None
