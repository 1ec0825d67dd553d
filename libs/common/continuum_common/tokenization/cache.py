"""Byte-bounded caches for the prompt encoder (pure data structures, no I/O, no threads).

* `ByteLRU` — least-recently-used eviction by the byte sizes the caller declares; used for the
  chain nodes and whole-text results (tens of lookups per request).
* `TwoGenerationCache` — an approximate LRU for the word-chunk token cache, which sees hundreds
  of lookups per request: a lookup is one dict probe, no reordering. New entries go to the
  young generation; a hit in the old generation is promoted; when the young generation holds
  half the budget it becomes the old one and the previous old generation is dropped whole.
  Entries used within the last half-budget of insertions always survive.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    # Values and their sizes are kept apart, not as (value, size) pairs: a pair around a tuple
    # value would be a nested tuple, which the cyclic collector untracks only one level per
    # collection (see encoder.py).
    __slots__ = ("_data", "_sizes", "bytes", "evictions", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self._data: OrderedDict[K, V] = OrderedDict()
        self._sizes: dict[K, int] = {}
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is None:
            return None
        self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V, size: int) -> None:
        """Insert (or replace) `key`; an entry larger than the whole budget is not kept."""
        if self._data.pop(key, None) is not None:
            self.bytes -= self._sizes.pop(key)
        if size > self.max_bytes:
            return
        self._data[key] = value
        self._sizes[key] = size
        self.bytes += size
        while self.bytes > self.max_bytes:
            dropped, _ = self._data.popitem(last=False)
            self.bytes -= self._sizes.pop(dropped)
            self.evictions += 1

    def clear(self) -> None:
        self._data.clear()
        self._sizes.clear()
        self.bytes = 0


class TwoGenerationCache(Generic[K, V]):
    """Sizes come from `sizer(key, value)`, called once per insertion or promotion."""

    __slots__ = ("_old", "_sizer", "_young", "_young_bytes", "evictions", "max_bytes")

    def __init__(self, max_bytes: int, sizer: Callable[[K, V], int]) -> None:
        self.max_bytes = max(0, max_bytes)
        self._sizer = sizer
        self._young: dict[K, V] = {}
        self._old: dict[K, V] = {}
        self._young_bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    @property
    def bytes(self) -> int:
        """The bytes held (each generation holds at most half the budget)."""
        return self._young_bytes + sum(self._sizer(k, v) for k, v in self._old.items())

    def get_many(self, keys: Sequence[K]) -> list[V | None]:
        """Values in key order (None = absent). The young generation is probed in C; only the
        keys it lacks go through `get`."""
        values = list(map(self._young.get, keys))
        if None in values:
            get = self.get
            values = [v if v is not None else get(k) for k, v in zip(keys, values, strict=True)]
        return values

    def get(self, key: K) -> V | None:
        value = self._young.get(key)
        if value is not None:
            return value
        value = self._old.pop(key, None)
        if value is not None:
            self._insert(key, value, self._sizer(key, value))  # promoted, counted again
        return value

    def put(self, key: K, value: V) -> None:
        """Insert a key that `get` just reported absent."""
        size = self._sizer(key, value)
        if size <= self.max_bytes // 2:
            self._insert(key, value, size)

    def _insert(self, key: K, value: V, size: int) -> None:
        if self._young_bytes + size > self.max_bytes // 2:
            self.evictions += len(self._old)
            self._old = self._young
            self._young = {}
            self._young_bytes = 0
        self._young[key] = value
        self._young_bytes += size

    def clear(self) -> None:
        self._young.clear()
        self._old.clear()
        self._young_bytes = 0
