"""The six `selection_strategy` values (seed §"Backend 선택 파이프라인").

A strategy chooses one backend from a non-empty, stable-ordered candidate list (the eligible
backends for the model: enabled, healthy, circuit not open, not already tried). Strategies hold
only their own small decision state (round-robin counters, smooth-WRR current weights), keyed by
the candidate set so one model's traffic does not skew another's; a hot reload builds new
strategy objects, which is why that state is never shared across snapshots.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from continuum_common.config import SelectionStrategy
from continuum_common.ring import HashRing, RouteLabel, ring_position

_MAX_TRACKED_SETS = 256  # candidate sets with their own counters (bounded: sets come from config)


class CandidateView(Protocol):
    """What a strategy may read about a backend (the pool's live state satisfies it)."""

    @property
    def name(self) -> str: ...
    @property
    def weight(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def latency(self) -> float | None: ...
    @property
    def success_rate(self) -> float: ...


# Not frozen (built per request; a frozen dataclass costs 4x to build). Treat as immutable.
@dataclass(slots=True)
class SelectionInput:
    model: str
    prefix_key: bytes | None
    session_key: str | None


# Not frozen (built per request; a frozen dataclass costs 4x to build). Treat as immutable.
@dataclass(slots=True)
class Choice:
    backend: str
    # Set only when PrefixAwareHash ran: the seed's prefix_hash / overflow / fallback label.
    label: RouteLabel | None = None


class Strategy(Protocol):
    kind: SelectionStrategy

    def choose(self, candidates: Sequence[CandidateView], request: SelectionInput) -> Choice: ...


def _set_key(candidates: Sequence[CandidateView]) -> tuple[str, ...]:
    return tuple(c.name for c in candidates)


class RoundRobin:
    kind = SelectionStrategy.ROUND_ROBIN

    def __init__(self) -> None:
        self._next: dict[tuple[str, ...], int] = {}

    def choose(self, candidates: Sequence[CandidateView], request: SelectionInput) -> Choice:
        key = _set_key(candidates)
        i = self._next.get(key, 0)
        if len(self._next) >= _MAX_TRACKED_SETS and key not in self._next:
            self._next.clear()
        self._next[key] = i + 1
        return Choice(candidates[i % len(candidates)].name)


class WeightedRoundRobin:
    """Smooth weighted round robin (nginx): every pick adds each weight to its backend's current
    value, takes the largest and subtracts the total from it. Weights 5:1:1 give a,a,b,a,c,a,a
    rather than five a's in a row."""

    kind = SelectionStrategy.WEIGHTED_ROUND_ROBIN

    def __init__(self) -> None:
        self._current: dict[tuple[str, ...], dict[str, int]] = {}

    def choose(self, candidates: Sequence[CandidateView], request: SelectionInput) -> Choice:
        key = _set_key(candidates)
        current = self._current.get(key)
        if current is None:
            if len(self._current) >= _MAX_TRACKED_SETS:
                self._current.clear()
            current = self._current[key] = dict.fromkeys(key, 0)
        total = 0
        best: str | None = None
        best_value = 0
        for c in candidates:
            value = current[c.name] + c.weight
            current[c.name] = value
            total += c.weight
            if best is None or value > best_value:
                best, best_value = c.name, value
        assert best is not None
        current[best] -= total
        return Choice(best)


class LeastLatency:
    """Lowest EWMA latency, scaled by (1 + in-flight) so one fast backend is not buried under
    every concurrent request. A backend with no sample yet scores 0 and is tried first, which
    is how a new or recovered backend gets measured."""

    kind = SelectionStrategy.LEAST_LATENCY

    def choose(self, candidates: Sequence[CandidateView], request: SelectionInput) -> Choice:
        best = candidates[0]
        best_score = _latency_score(best)
        for c in candidates[1:]:
            score = _latency_score(c)
            if score < best_score:
                best, best_score = c, score
        return Choice(best.name)


def _latency_score(c: CandidateView) -> float:
    latency = c.latency
    return 0.0 if latency is None else latency * (1 + c.in_flight)


class Random:
    """Uniform choice (weights are WeightedRoundRobin's business)."""

    kind = SelectionStrategy.RANDOM

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(self, candidates: Sequence[CandidateView], request: SelectionInput) -> Choice:
        return Choice(candidates[self._rng.randrange(len(candidates))].name)


class RingCache:
    """One immutable HashRing per candidate set. Excluding a dead backend builds the ring of the
    survivors, whose points are the same as before, so only the dead backend's keys move."""

    def __init__(self, virtual_nodes: int, epsilon: float) -> None:
        self.virtual_nodes = virtual_nodes
        self.epsilon = epsilon
        self._rings: dict[tuple[str, ...], HashRing] = {}

    def ring(self, candidates: Sequence[CandidateView]) -> HashRing:
        key = _set_key(candidates)
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= _MAX_TRACKED_SETS:
                self._rings.clear()
            ring = self._rings[key] = HashRing(key, virtual_nodes=self.virtual_nodes, epsilon=self.epsilon)
        return ring


class ConsistentHash:
    """Plain consistent hashing of a session key (X-Session-ID header, else the `user` field):
    one session stays on one backend while the pool is unchanged. Requests without a session key
    are spread round-robin rather than all hashed to one spot."""

    kind = SelectionStrategy.CONSISTENT_HASH

    def __init__(self, rings: RingCache) -> None:
        self._rings = rings
        self._no_session = RoundRobin()

    def choose(self, candidates: Sequence[CandidateView], request: SelectionInput) -> Choice:
        if not request.session_key:
            return self._no_session.choose(candidates, request)
        ring = self._rings.ring(candidates)
        return Choice(ring.owner(ring_position(request.session_key.encode("utf-8"))))


class PrefixAwareHash:
    """Tier 1: the CHWBL ring over live in-flight loads (continuum_common.ring). With no prefix
    key the model name is hashed with no bound (label `fallback`)."""

    kind = SelectionStrategy.PREFIX_AWARE_HASH

    def __init__(self, rings: RingCache) -> None:
        self._rings = rings

    def choose(self, candidates: Sequence[CandidateView], request: SelectionInput) -> Choice:
        ring = self._rings.ring(candidates)
        loads: Mapping[str, int] = {c.name: c.in_flight for c in candidates}
        picked = ring.lookup(request.prefix_key, request.model, loads)
        return Choice(picked.backend, picked.label)


def build_strategy(
    kind: SelectionStrategy, *, virtual_nodes: int, epsilon: float, rng: random.Random | None = None
) -> Strategy:
    rings = RingCache(virtual_nodes, epsilon)
    if kind is SelectionStrategy.ROUND_ROBIN:
        return RoundRobin()
    if kind is SelectionStrategy.WEIGHTED_ROUND_ROBIN:
        return WeightedRoundRobin()
    if kind is SelectionStrategy.LEAST_LATENCY:
        return LeastLatency()
    if kind is SelectionStrategy.RANDOM:
        return Random(rng)
    if kind is SelectionStrategy.CONSISTENT_HASH:
        return ConsistentHash(rings)
    return PrefixAwareHash(rings)
