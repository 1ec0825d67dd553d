"""Which backend produced each recent Responses answer (pure; the caller passes the clock).

A bounded LRU map of response id -> backend name with a time to live: the least recently used
id goes first when it is full, and an id older than the TTL is forgotten when looked up. An id
is looked up once per turn of a conversation, so a conversation in use stays in the map.
"""

from __future__ import annotations

from collections import OrderedDict


class ResponseOwners:
    def __init__(self, max_entries: int, ttl_s: float) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._owners: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (backend, learnt at)

    def __len__(self) -> int:
        return len(self._owners)

    def remember(self, response_id: str, backend: str, now: float) -> None:
        owners = self._owners
        owners[response_id] = (backend, now)
        owners.move_to_end(response_id)
        while len(owners) > self.max_entries:
            owners.popitem(last=False)

    def owner(self, response_id: str, now: float) -> str | None:
        entry = self._owners.get(response_id)
        if entry is None:
            return None
        backend, at = entry
        if now - at > self.ttl_s:
            del self._owners[response_id]
            return None
        self._owners.move_to_end(response_id)
        return backend

    def resize(self, max_entries: int, ttl_s: float) -> None:
        """New bounds (a configuration reload); the oldest ids go first when it shrinks."""
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries, self.ttl_s = max_entries, ttl_s
        while len(self._owners) > max_entries:
            self._owners.popitem(last=False)
