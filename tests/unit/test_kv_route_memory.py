"""RouteMemory (kv/route_memory.py) and the approximate text chunks (kv/chunks.py)."""

from __future__ import annotations

import gc
from collections import OrderedDict

from hypothesis import given
from hypothesis import strategies as st

from continuum_ingress.kv.chunks import chunk_chain, conversation_bytes
from continuum_ingress.kv.route_memory import RouteMemory
from continuum_ingress.protocol.apis import Api


def test_records_match_as_a_leading_prefix() -> None:
    memory = RouteMemory(10.0)
    memory.record("a", [1, 2, 3, 4], now=0.0)
    memory.record("b", [1, 2, 9], now=0.0)
    assert memory.match([1, 2, 3, 4, 5], ["a", "b", "c"], now=1.0) == {"a": 4, "b": 2}
    assert memory.match([7, 8, 9], ["a", "b"], now=1.0) == {}  # chained keys: another root, other keys


def test_entries_expire() -> None:
    memory = RouteMemory(10.0)
    memory.record("a", [1, 2, 3], now=0.0)
    memory.record("a", [1, 2], now=5.0)  # the head refreshed later than the tail
    assert memory.match([1, 2, 3], ["a"], now=9.0) == {"a": 3}
    assert memory.match([1, 2, 3], ["a"], now=12.0) == {"a": 2}
    assert memory.match([1, 2, 3], ["a"], now=16.0) == {}


def test_capacity_drops_the_least_recently_routed_tail_first() -> None:
    memory = RouteMemory(100.0, capacity=5)
    memory.record("a", [1, 2, 3, 4], now=0.0)
    memory.record("a", [1, 7, 8], now=1.0)  # 1 refreshed; 2, 3, 4 are now the oldest
    assert memory.entries("a") == 5
    assert memory.match([1, 2, 3, 4], ["a"], now=2.0) == {"a": 3}  # 4 (the oldest tail) went first
    assert memory.match([1, 7, 8], ["a"], now=2.0) == {"a": 3}


def test_wipe_and_disabled() -> None:
    memory = RouteMemory(10.0)
    memory.record("a", [1, 2], now=0.0)
    memory.wipe("a")
    assert memory.match([1, 2], ["a"], now=0.0) == {}
    off = RouteMemory(0.0)
    off.record("a", [1], now=0.0)
    assert len(off) == 0


@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=6), min_size=1, max_size=20))
def test_binary_search_equals_a_walk_for_recorded_chains(chains: list[list[int]]) -> None:
    # Chains are built as prefix trees (like conversations): chain keys = the path of values.
    memory = RouteMemory(1e9)
    recorded = []
    for i, values in enumerate(chains):
        keys = [hash(tuple(values[: j + 1])) for j in range(len(values))]
        memory.record("a", keys, now=float(i))
        recorded.append(keys)
    held = set()
    for keys in recorded:
        held.update(keys)
    for keys in recorded:
        walk = 0
        for k in keys:
            if k not in held:
                break
            walk += 1
        assert memory.match(keys, ["a"], now=1.0) == {"a": walk}


def test_restored_records_expire_by_their_age_and_never_shorten_later_ones() -> None:
    memory = RouteMemory(10.0)
    memory.record("a", [1, 2, 3], now=100.0, age=12.0)  # expired before the process started
    assert len(memory) == 0
    memory.record("a", [1, 2], now=100.0)  # live, expires at 110
    memory.record("a", [1, 2, 3, 4], now=100.0, age=6.0)  # recorded at 94, expires at 104
    assert memory.match([1, 2, 3, 4], ["a"], now=103.0) == {"a": 4}
    assert memory.match([1, 2, 3, 4], ["a"], now=105.0) == {"a": 2}  # the live head kept its expiry
    assert memory.match([1, 2, 3, 4], ["a"], now=111.0) == {}
    # replayed oldest first: a later record of the history extends an earlier one
    memory.record("b", [5, 6], now=100.0, age=8.0)
    memory.record("b", [5, 6, 7], now=100.0, age=2.0)
    assert memory.match([5, 6, 7], ["b"], now=107.0) == {"b": 3}


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=5), st.booleans(), st.floats(0.0, 30.0)),
        min_size=1,
        max_size=24,
    ),
    st.floats(0.0, 40.0),
)
def test_restores_and_records_keep_held_hashes_a_prefix(ops: list[tuple[list[int], bool, float]], later: float) -> None:
    # Live records and replayed ones (any age) interleaved: a chain's held hashes are still
    # exactly its leading held run, so the binary search equals a walk at any later time.
    memory = RouteMemory(20.0)
    chains = []
    for values, restored, age in ops:
        keys = [hash(tuple(values[: j + 1])) for j in range(len(values))]
        if restored:
            memory.record("a", keys, now=50.0, age=age)
        else:
            memory.record("a", keys, now=50.0)
        chains.append(keys)
    now = 50.0 + later
    for keys in chains:
        expiry = [memory._backends.get("a", {}).get(k) for k in keys]
        walk = 0
        for e in expiry:
            if e is None or e <= now:
                break
            walk += 1
        assert all(e is None or e <= now for e in expiry[walk:])  # nothing held past the run
        assert memory.match(keys, ["a"], now=now) == ({"a": walk} if walk else {})


def test_chunk_chains_share_exactly_the_common_prefix() -> None:
    base = {"messages": [{"role": "system", "content": "s" * 1000}, {"role": "user", "content": "hello " * 50}]}
    turn2 = {
        "messages": [
            *base["messages"],
            {"role": "assistant", "content": "x" * 300},
            {"role": "user", "content": "more"},
        ]
    }
    a = chunk_chain(conversation_bytes(Api.CHAT, base), 256)
    b = chunk_chain(conversation_bytes(Api.CHAT, turn2), 256)
    assert len(a) == len(conversation_bytes(Api.CHAT, base)) // 256
    assert b[: len(a)] == a and len(b) > len(a)
    other = {"messages": [{"role": "system", "content": "t" + "s" * 999}]}
    assert chunk_chain(conversation_bytes(Api.CHAT, other), 256)[0] != a[0]


def test_conversation_bytes_of_each_api() -> None:
    assert conversation_bytes(Api.COMPLETIONS, {"prompt": "abc"}) == b"abc"
    assert len(conversation_bytes(Api.COMPLETIONS, {"prompt": [1, 2, 3]})) == 24
    anthropic = conversation_bytes(Api.MESSAGES, {"system": "sys", "messages": [{"role": "user", "content": "hi"}]})
    assert b"sys" in anthropic and b"hi" in anthropic
    # the role is part of the rendering: the same text under another role is another chain
    u = conversation_bytes(Api.CHAT, {"messages": [{"role": "user", "content": "x"}]})
    s = conversation_bytes(Api.CHAT, {"messages": [{"role": "system", "content": "x"}]})
    assert u != s


def test_extends_continues_what_the_index_confirms() -> None:
    memory = RouteMemory(10.0)
    chain = list(range(100, 110))
    memory.record("a", chain[4:8], now=0.0)  # the engine had already reported blocks 0-3
    assert memory.extends("a", chain, 4, now=1.0) == 8
    assert memory.extends("a", chain, 6, now=1.0) == 8  # the index caught up further
    assert memory.extends("a", chain, 2, now=1.0) == 2  # records do not continue from there
    assert memory.extends("b", chain, 3, now=1.0) == 3
    assert memory.extends("a", chain, 4, now=11.0) == 4  # expired


def test_reserved_records_are_reused_and_stay_out_of_the_collectors_view() -> None:
    """Records made before the process freezes its start-up heap are the ones backends fill, and
    a wiped backend's are emptied and reused: no full collection walks their hashes."""
    memory = RouteMemory(1e9)
    memory.reserve(2)

    def big_dicts() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, OrderedDict) and len(o) >= 1_000)

    gc.freeze()
    try:
        chain = list(range(1, 3_001))
        memory.record("a", chain, now=0.0)
        memory.record("b", chain, now=0.0)
        memory.wipe("a")  # its engine restarted
        memory.record("c", chain, now=1.0)  # takes a's emptied records
        assert memory.match(chain, ["a", "b", "c"], now=2.0) == {"b": 3_000, "c": 3_000}
        assert big_dicts() == 0
        memory.record("d", chain, now=1.0)  # beyond what was reserved: new records, walked
        assert big_dicts() == 1
    finally:
        gc.unfreeze()
