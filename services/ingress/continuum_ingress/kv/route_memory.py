"""What this router (and, over NATS, its sibling replicas) recently sent where: chains of block or
chunk hashes per backend, with an expiry (pure bookkeeping; the caller passes the clock).

Two uses (docs/kv-scorer.md):

* approximate mode: the whole index. A request's text-chunk chain is recorded against the
  backend it went to and lives `approximate.ttl_seconds`; at most `capacity` entries per backend
  (the backend's cache size in chunks), least recently routed first out;
* precise mode: speculative entries. The engine reports the blocks of a new prompt only once it
  has computed them, so for `speculative_ttl_ms` the blocks this router just sent are assumed
  held, and a burst of requests with a new prefix sticks to one backend.

A chain is recorded tail first, so within a backend the head of a conversation is always more
recent than its tail: expiry and the capacity bound remove a chain from its end, and what is
held stays a prefix of what was recorded. That is what lets `match()` find the matched length by
binary search (O(log n) lookups per backend) instead of walking every hash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

DEFAULT_MAX_ENTRIES = 1_000_000  # per backend, when no capacity is known


class RouteMemory:
    def __init__(self, ttl_s: float, *, capacity: int | None = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.capacity = min(capacity, max_entries) if capacity is not None else max_entries
        # backend -> hash -> expiry; order = order of the last record (oldest first).
        self._backends: dict[str, OrderedDict[int, float]] = {}
        self._spare: list[OrderedDict[int, float]] = []  # made ahead (reserve), or emptied

    def reserve(self, backends: int) -> None:
        """Make the records of `backends` backends now; backends take them as they are first
        recorded, and a wiped backend's go back emptied, never replaced. Why: the ingress
        freezes what exists at start-up out of the cyclic garbage collector's view, and these
        ordered dicts hold tens of thousands of hashes each, which every collection of their
        generation would otherwise walk."""
        self._spare += [OrderedDict() for _ in range(max(0, backends))]

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def __len__(self) -> int:
        return sum(len(d) for d in self._backends.values())

    def entries(self, backend: str) -> int:
        d = self._backends.get(backend)
        return len(d) if d is not None else 0

    def record(self, backend: str, chain: Sequence[int], now: float, age: float = 0.0) -> None:
        """`chain` sent to `backend` `age` seconds before `now` (0: just now; more: a replayed
        decision, oldest first). It expires that much sooner (an expired one is not recorded)
        and never shortens what a later record keeps. A hash's predecessors are in every chain
        that holds it and each record gives its whole chain one expiry, so keeping the later of
        two keeps held hashes a prefix of any chain."""
        expiry = now - age + self.ttl_s
        if not self.enabled or not chain or expiry <= now:
            return
        entries = self._backends.get(backend)
        if entries is None:
            entries = self._backends[backend] = self._spare.pop() if self._spare else OrderedDict()
        move = entries.move_to_end
        for h in reversed(chain):
            held = entries.get(h)
            if held is None:
                entries[h] = expiry
            elif held <= expiry:
                entries[h] = expiry
                move(h)
        self._trim(entries, now)

    def match(self, chain: Sequence[int], backends: Iterable[str], now: float) -> dict[str, int]:
        """Leading hashes of `chain` each backend holds (backends with none are left out)."""
        out: dict[str, int] = {}
        if not chain:
            return out
        for backend in backends:
            entries = self._backends.get(backend)
            if not entries:
                continue
            held = _leading(entries, chain, now)
            if held:
                out[backend] = held
        return out

    def extends(self, backend: str, chain: Sequence[int], start: int, now: float) -> int:
        """How far the records of `backend` continue `chain` past its first `start` hashes
        (which the caller knows are held: precise mode records only what the engine has not
        reported yet); `start` when they do not continue it."""
        entries = self._backends.get(backend)
        if not entries or start >= len(chain):
            return start
        first = entries.get(chain[start])
        if first is None or first <= now:  # the records start further on: they do not continue it
            return start
        return start + _leading(entries, chain[start:], now)

    def wipe(self, backend: str) -> None:
        """Forget a backend (its engine cleared its cache or restarted)."""
        entries = self._backends.pop(backend, None)
        if entries is not None:
            entries.clear()
            self._spare.append(entries)

    def clear(self) -> None:
        for backend in list(self._backends):
            self.wipe(backend)

    def _trim(self, entries: OrderedDict[int, float], now: float) -> None:
        while len(entries) > self.capacity:
            entries.popitem(last=False)
        # Expired entries sit at the old end (same TTL for every record): drop a few per write.
        for _ in range(64):
            if not entries:
                break
            oldest = next(iter(entries.values()))
            if oldest > now:
                break
            entries.popitem(last=False)


def _leading(entries: OrderedDict[int, float], chain: Sequence[int], now: float) -> int:
    """The largest k such that chain[k-1] is held (held hashes form a prefix of the chain)."""
    lo, hi = 0, len(chain)
    get = entries.get
    while lo < hi:
        mid = (lo + hi + 1) // 2
        expiry = get(chain[mid - 1])
        if expiry is not None and expiry > now:
            lo = mid
        else:
            hi = mid - 1
    return lo
