"""Speculative (provisional) KV index entries, local to one ingress process.

Right after the ingress sends a prefix to a backend (a KV-aware decision or a PrefixAwareHash
decision), the engine has not cached it yet, and its KV event reaches the index tens of
milliseconds after the prefill. A burst of requests with a new prefix would in that window
still see an index that knows nothing, and could be spread over several engines. A provisional
`(prefix, backend)` entry bridges the gap: for `speculative_ttl_ms` after the decision the scorer
treats the backend as holding the prefix (policy/kv_scoring.py says how it is scored).

Bounded: at most `max_prefixes` prefixes, the least recently recorded dropped first; expired
entries are dropped lazily on read and from the old end on every write. Pure: the caller passes
the clock.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_MAX_PREFIXES = 65_536


class SpeculativeEntries:
    def __init__(self, ttl_s: float, *, max_prefixes: int = DEFAULT_MAX_PREFIXES) -> None:
        self.ttl_s = ttl_s
        self.max_prefixes = max_prefixes
        # prefix hash -> {backend: expiry}; order = order of the last record (oldest first).
        self._entries: OrderedDict[str, dict[str, float]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def __len__(self) -> int:
        return sum(len(b) for b in self._entries.values())

    def record(self, prefix_hash: str, backend: str, now: float) -> None:
        if not self.enabled:
            return
        backends = self._entries.get(prefix_hash)
        if backends is None:
            backends = self._entries[prefix_hash] = {}
        else:
            self._entries.move_to_end(prefix_hash)
        backends[backend] = now + self.ttl_s
        self._trim(now)

    def backends(self, prefix_hash: str, now: float) -> tuple[str, ...]:
        """Backends with a live provisional entry for the prefix."""
        backends = self._entries.get(prefix_hash)
        if not backends:
            return ()
        live = tuple(b for b, expiry in backends.items() if expiry > now)
        if len(live) != len(backends):
            if live:
                for b in [b for b, expiry in backends.items() if expiry <= now]:
                    del backends[b]
            else:
                del self._entries[prefix_hash]
        return live

    def clear(self) -> None:
        self._entries.clear()

    def _trim(self, now: float) -> None:
        while len(self._entries) > self.max_prefixes:
            self._entries.popitem(last=False)
        # The oldest-recorded prefixes expire first: drop them while they are all expired.
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if max(oldest.values()) > now:
                break
            self._entries.popitem(last=False)
