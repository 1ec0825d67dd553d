"""Selection strategies as pure functions of candidates: the distribution each one produces."""

from __future__ import annotations

import collections
import hashlib
import random
from dataclasses import dataclass

import pytest

from continuum_common.config import SelectionStrategy
from continuum_common.ring import RouteLabel
from continuum_ingress.policy.strategies import (
    ConsistentHash,
    LeastLatency,
    PrefixAwareHash,
    Random,
    RingCache,
    RoundRobin,
    SelectionInput,
    WeightedRoundRobin,
    build_strategy,
)


@dataclass
class C:
    name: str
    weight: int = 1
    in_flight: int = 0
    latency: float | None = None
    success_rate: float = 1.0


def _key(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


NO_KEY = SelectionInput("m", None, None)


def test_round_robin_cycles_in_order() -> None:
    rr = RoundRobin()
    cands = [C("a"), C("b"), C("c")]
    assert [rr.choose(cands, NO_KEY).backend for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    # A different candidate set (one excluded) has its own counter.
    assert rr.choose([C("a"), C("c")], NO_KEY).backend == "a"


def test_smooth_weighted_round_robin_interleaves_by_weight() -> None:
    wrr = WeightedRoundRobin()
    cands = [C("a", 5), C("b", 1), C("c", 1)]
    picks = [wrr.choose(cands, NO_KEY).backend for _ in range(7)]
    assert picks == ["a", "a", "b", "a", "c", "a", "a"]
    counts = collections.Counter(wrr.choose(cands, NO_KEY).backend for _ in range(700))
    assert counts == {"a": 500, "b": 100, "c": 100}


def test_least_latency_prefers_fast_and_untried_backends() -> None:
    ll = LeastLatency()
    assert ll.choose([C("a", latency=0.05), C("b", latency=0.01), C("c", latency=0.02)], NO_KEY).backend == "b"
    assert ll.choose([C("a", latency=0.05), C("b")], NO_KEY).backend == "b"  # no sample yet: measure it
    # Busy fast backend: 0.01 * (1 + 9) = 0.1 > 0.05 * 1.
    assert ll.choose([C("a", latency=0.05), C("b", latency=0.01, in_flight=9)], NO_KEY).backend == "a"


def test_random_is_roughly_uniform() -> None:
    rnd = Random(random.Random(1))
    cands = [C("a"), C("b"), C("c")]
    counts = collections.Counter(rnd.choose(cands, NO_KEY).backend for _ in range(3000))
    assert set(counts) == {"a", "b", "c"}
    assert all(850 < n < 1150 for n in counts.values())


def test_consistent_hash_keeps_a_session_and_spreads_sessions() -> None:
    ch = ConsistentHash(RingCache(150, 0.25))
    cands = [C("a"), C("b"), C("c")]
    first = ch.choose(cands, SelectionInput("m", None, "session-42")).backend
    assert all(ch.choose(cands, SelectionInput("m", None, "session-42")).backend == first for _ in range(20))
    owners = collections.Counter(ch.choose(cands, SelectionInput("m", None, f"s{i}")).backend for i in range(600))
    assert set(owners) == {"a", "b", "c"} and min(owners.values()) > 100
    # Removing a backend moves only its own sessions.
    survivors = [C("a"), C("b")]
    for i in range(200):
        before = ch.choose(cands, SelectionInput("m", None, f"s{i}")).backend
        after = ch.choose(survivors, SelectionInput("m", None, f"s{i}")).backend
        if before != "c":
            assert after == before
    # No session key: round robin.
    assert [ch.choose(cands, NO_KEY).backend for _ in range(3)] == ["a", "b", "c"]


def test_prefix_aware_hash_sticks_then_overflows_then_falls_back() -> None:
    pah = PrefixAwareHash(RingCache(150, 0.25))
    key = _key("system prompt")
    cands = [C("a"), C("b"), C("c")]
    first = pah.choose(cands, SelectionInput("m", key, None))
    assert first.label is RouteLabel.PREFIX_HASH
    owner = first.backend
    # Loads below the bound keep the owner: total 3 -> bound = ceil(1.25 * 4 / 3) = 2.
    loaded = [C(c.name, in_flight=1) for c in cands]
    assert pah.choose(loaded, SelectionInput("m", key, None)).backend == owner
    # total=4 -> bound = ceil(1.25 * 5 / 3) = 3: the owner at 3 overflows clockwise.
    hot = [C(c.name, in_flight=3 if c.name == owner else 1) for c in cands]
    over = pah.choose(hot, SelectionInput("m", key, None))
    assert over.label is RouteLabel.OVERFLOW and over.backend != owner
    # No prefix key: model-name hash, no bound, label fallback.
    fb = [pah.choose([C(c.name, in_flight=50) for c in cands], SelectionInput("m", None, None)) for _ in range(3)]
    assert {f.label for f in fb} == {RouteLabel.FALLBACK} and len({f.backend for f in fb}) == 1


def test_prefix_aware_hash_spreads_distinct_prefixes() -> None:
    pah = PrefixAwareHash(RingCache(150, 0.25))
    cands = [C("a"), C("b"), C("c")]
    counts = collections.Counter(
        pah.choose(cands, SelectionInput("m", _key(f"p{i}"), None)).backend for i in range(900)
    )
    assert all(200 < n < 400 for n in counts.values())


@pytest.mark.parametrize("kind", list(SelectionStrategy))
def test_build_strategy_covers_every_kind(kind: SelectionStrategy) -> None:
    strategy = build_strategy(kind, virtual_nodes=10, epsilon=0.25)
    assert strategy.kind is kind
    assert strategy.choose([C("x")], SelectionInput("m", _key("k"), "s")).backend == "x"
