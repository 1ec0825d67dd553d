"""The local memo of gemini-cache lookup answers: a bounded LRU map with a lifetime per entry,
so repeated requests for one prefix ask the service at most once per `lookup_memo_ms`."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from continuum_common.wire.gemini import LookupReply

MemoKey = tuple[str, str]  # (backend, digest)
DEFAULT_MAX_ENTRIES = 10_000


class LookupMemo:
    def __init__(
        self,
        ttl_s: float,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[MemoKey, tuple[float, LookupReply]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: MemoKey) -> LookupReply | None:
        item = self._entries.get(key)
        if item is None:
            return None
        if item[0] <= self._clock():
            del self._entries[key]
            return None
        # A hit makes the entry the most recently used: eviction takes the least recently used.
        self._entries.move_to_end(key)
        return item[1]

    def put(self, key: MemoKey, reply: LookupReply, ttl_s: float | None = None) -> None:
        ttl = self.ttl_s if ttl_s is None else min(ttl_s, self.ttl_s)
        if ttl <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = (self._clock() + ttl, reply)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def forget(self, key: MemoKey) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
