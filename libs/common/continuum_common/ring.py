"""Consistent hashing with bounded loads (CHWBL) for Tier 1 prefix routing.

Each backend owns `virtual_nodes` points on a 64-bit ring (SHA-256 of "<name>#<i>", first 8
bytes). A key's owner is the first point clockwise of the key's position. With a prefix key the
walk is bounded: a backend may take the request only while its in-flight count is below

    bound = ceil((1 + epsilon) * (total_in_flight + 1) / number_of_backends)

(the incoming request counted in the total), so nobody exceeds the bound while somebody else is
under it. The walk visits distinct backends clockwise; when every backend is at the bound the
owner keeps the request to preserve locality. Without a prefix key the model name is hashed and
the first point clockwise is taken with no bound at all (the seed's "fallback" path).

The ring is immutable: a configuration change builds a new one, so lookups never see a
half-built ring. Lookups are pure over (ring, key, loads).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class RouteLabel(StrEnum):
    """The seed's `continuum_prefix_routing_requests_total{strategy}` label values."""

    PREFIX_HASH = "prefix_hash"
    OVERFLOW = "overflow"
    FALLBACK = "fallback"


# Not frozen (built per request; a frozen dataclass costs 4x to build). Treat as immutable.
@dataclass(slots=True)
class RingChoice:
    backend: str
    label: RouteLabel
    owner: str


def ring_position(data: bytes) -> int:
    """Position of arbitrary bytes on the ring: first 8 bytes of SHA-256, big-endian."""
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def key_position(prefix_key: bytes) -> int:
    """A prefix key is already a SHA-256 digest; its first 8 bytes are uniform."""
    return int.from_bytes(prefix_key[:8], "big")


def load_bound(total_in_flight: int, backends: int, epsilon: float) -> int:
    return math.ceil((1.0 + epsilon) * (total_in_flight + 1) / backends)


class HashRing:
    """An immutable CHWBL ring over a set of backend names."""

    __slots__ = ("_backends", "_owners", "_points", "_walks", "epsilon", "virtual_nodes")

    def __init__(self, backends: Iterable[str], *, virtual_nodes: int = 150, epsilon: float = 0.25) -> None:
        names = sorted(set(backends))
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be at least 1")
        self.virtual_nodes = virtual_nodes
        self.epsilon = epsilon
        self._backends: tuple[str, ...] = tuple(names)
        points = sorted((ring_position(f"{name}#{i}".encode()), name) for name in names for i in range(virtual_nodes))
        self._points: list[int] = [p for p, _ in points]
        self._owners: list[str] = [n for _, n in points]
        # Distinct-backend walk order from each point, filled lazily: the bounded walk needs at
        # most one pass per point, and most points are never the start of a walk.
        self._walks: dict[int, tuple[str, ...]] = {}

    @property
    def backends(self) -> tuple[str, ...]:
        return self._backends

    def __len__(self) -> int:
        return len(self._backends)

    def _index(self, position: int) -> int:
        i = bisect.bisect_left(self._points, position)
        return 0 if i == len(self._points) else i

    def _walk(self, start: int) -> tuple[str, ...]:
        walk = self._walks.get(start)
        if walk is None:
            seen: dict[str, None] = {}
            count = len(self._owners)
            want = len(self._backends)
            for step in range(count):
                seen.setdefault(self._owners[(start + step) % count], None)
                if len(seen) == want:
                    break
            walk = tuple(seen)
            self._walks[start] = walk
        return walk

    def owner(self, position: int) -> str:
        """The first backend clockwise of `position` (no bound)."""
        if not self._points:
            raise LookupError("the ring has no backends")
        return self._owners[self._index(position)]

    def lookup(self, prefix_key: bytes | None, model: str, loads: Mapping[str, int]) -> RingChoice:
        """Choose a backend. `loads` maps backend name → live in-flight count (missing = 0)."""
        if not self._points:
            raise LookupError("the ring has no backends")
        if prefix_key is None:
            owner = self._owners[self._index(ring_position(model.encode("utf-8")))]
            return RingChoice(owner, RouteLabel.FALLBACK, owner)
        walk = self._walk(self._index(key_position(prefix_key)))
        total = 0
        for name in self._backends:
            total += loads.get(name, 0)
        bound = load_bound(total, len(self._backends), self.epsilon)
        owner = walk[0]
        for name in walk:
            if loads.get(name, 0) < bound:
                label = RouteLabel.PREFIX_HASH if name == owner else RouteLabel.OVERFLOW
                return RingChoice(name, label, owner)
        return RingChoice(owner, RouteLabel.PREFIX_HASH, owner)
