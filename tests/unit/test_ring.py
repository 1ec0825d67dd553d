"""CHWBL ring: the bound, overflow, fallback and consistency properties (hypothesis)."""

from __future__ import annotations

import hashlib
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum_common.ring import HashRing, RouteLabel, load_bound


def key(i: int) -> bytes:
    return hashlib.sha256(f"prefix-{i}".encode()).digest()


names = st.lists(st.text("abcdefgh0123456789-", min_size=1, max_size=8), min_size=1, max_size=12, unique=True)


def test_bound_formula_counts_the_incoming_request() -> None:
    assert load_bound(0, 4, 0.25) == math.ceil(1.25 * 1 / 4) == 1
    assert load_bound(7, 4, 0.25) == math.ceil(1.25 * 8 / 4) == 3
    assert load_bound(100, 3, 0.01) == math.ceil(1.01 * 101 / 3)


@settings(max_examples=60, deadline=None)
@given(backends=names, keys=st.lists(st.integers(0, 50), min_size=1, max_size=200), epsilon=st.floats(0.01, 3.0))
def test_nobody_exceeds_the_bound_while_someone_is_under_it(
    backends: list[str], keys: list[int], epsilon: float
) -> None:
    ring = HashRing(backends, virtual_nodes=20, epsilon=epsilon)
    loads: Counter[str] = Counter()
    for k in keys:
        total = sum(loads.values())
        bound = load_bound(total, len(backends), epsilon)
        choice = ring.lookup(key(k), "m", loads)
        someone_under = any(loads[b] < bound for b in backends)
        if someone_under:
            assert loads[choice.backend] < bound  # after taking it, still <= bound
        else:
            assert choice.backend == choice.owner and choice.label is RouteLabel.PREFIX_HASH
        loads[choice.backend] += 1


@settings(max_examples=40, deadline=None)
@given(
    backends=names,
    k=st.integers(0, 10_000),
    loads=st.dictionaries(st.text("abcdefgh0123456789-", min_size=1, max_size=8), st.integers(0, 20)),
)
def test_same_key_and_loads_give_the_same_backend(backends: list[str], k: int, loads: dict[str, int]) -> None:
    a = HashRing(backends, virtual_nodes=30, epsilon=0.25)
    b = HashRing(list(reversed(backends)), virtual_nodes=30, epsilon=0.25)
    assert a.lookup(key(k), "m", loads) == b.lookup(key(k), "m", loads) == a.lookup(key(k), "m", loads)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_adding_or_removing_one_backend_moves_about_one_nth(n: int) -> None:
    backends = [f"b{i}" for i in range(n)]
    keys = [key(i) for i in range(20_000)]
    before = HashRing(backends, virtual_nodes=150)
    grown = HashRing([*backends, "new"], virtual_nodes=150)
    shrunk = HashRing(backends[1:], virtual_nodes=150)
    idle: dict[str, int] = {}
    moved_add = sum(before.lookup(k, "m", idle).backend != grown.lookup(k, "m", idle).backend for k in keys)
    moved_remove = sum(before.lookup(k, "m", idle).backend != shrunk.lookup(k, "m", idle).backend for k in keys)
    # Ideal is 1/(n+1) and 1/n; virtual nodes keep it within a loose factor.
    assert 0.5 / (n + 1) < moved_add / len(keys) < 1.6 / (n + 1)
    assert 0.5 / n < moved_remove / len(keys) < 1.6 / n
    # Only keys that went to the new backend moved; removal moves only the removed one's keys.
    for k in keys[:2000]:
        old, new = before.lookup(k, "m", idle).backend, grown.lookup(k, "m", idle).backend
        assert old == new or new == "new"
        old, new = before.lookup(k, "m", idle).backend, shrunk.lookup(k, "m", idle).backend
        assert old == new or old == "b0"


def test_distribution_is_even_with_150_virtual_nodes() -> None:
    ring = HashRing([f"b{i}" for i in range(8)], virtual_nodes=150)
    counts = Counter(ring.lookup(key(i), "m", {}).backend for i in range(40_000))
    assert max(counts.values()) / min(counts.values()) < 1.35


def test_overflow_goes_clockwise_to_the_next_distinct_backend() -> None:
    ring = HashRing(["a", "b", "c"], virtual_nodes=50, epsilon=0.25)
    k = key(1)
    owner = ring.lookup(k, "m", {}).backend
    # Owner at the bound (total 3 in flight → bound ceil(1.25*4/3) = 2).
    loads = {owner: 2, **{b: 0 for b in ring.backends if b != owner}}
    loads[next(b for b in ring.backends if b != owner)] = 1
    choice = ring.lookup(k, "m", loads)
    assert choice.label is RouteLabel.OVERFLOW and choice.owner == owner and choice.backend != owner
    # The next distinct backend clockwise, by walking the ring by hand.
    walk = ring._walk(ring._index(int.from_bytes(k[:8], "big")))
    expected = next(b for b in walk if loads[b] < load_bound(sum(loads.values()), 3, 0.25))
    assert choice.backend == expected


def test_everyone_at_the_bound_keeps_the_owner() -> None:
    ring = HashRing(["a", "b"], virtual_nodes=10, epsilon=0.01)
    k = key(2)
    owner = ring.lookup(k, "m", {}).backend
    choice = ring.lookup(k, "m", {"a": 5, "b": 5})
    assert choice.backend == owner and choice.label is RouteLabel.PREFIX_HASH


def test_fallback_hashes_the_model_without_a_bound() -> None:
    ring = HashRing(["a", "b", "c"], virtual_nodes=50)
    first = ring.lookup(None, "llama", {})
    assert first.label is RouteLabel.FALLBACK
    pos = int.from_bytes(hashlib.sha256(b"llama").digest()[:8], "big")
    assert first.backend == ring.owner(pos)
    # No bound: a huge load on the model's backend does not move it.
    assert ring.lookup(None, "llama", {first.backend: 1000}).backend == first.backend


def test_rebuild_with_new_virtual_nodes_is_clean() -> None:
    small = HashRing(["a", "b"], virtual_nodes=1)
    big = HashRing(["a", "b"], virtual_nodes=300)
    assert len(small._points) == 2 and len(big._points) == 600
    assert set(big._owners) == {"a", "b"}


def test_empty_ring_raises() -> None:
    with pytest.raises(LookupError):
        HashRing([]).lookup(key(1), "m", {})
