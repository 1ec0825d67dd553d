"""Pure parts of the block index: the packing the Redis scripts read, grouping and splitting a
pull batch, and InMemoryBlockIndex's one-walk match against a brute-force reading, for any
holdings and up to 40 backends (bits beyond one machine word)."""

from __future__ import annotations

import gc
import random
import struct
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from continuum_common.kvindex import InMemoryBlockIndex, MatchQuery
from continuum_common.kvindex.block_pack import (
    EVENT_STAMPS,
    batch_blocks,
    group_by_backend,
    pack_chain,
    pack_parts,
    split_by_size,
    stamp,
)
from continuum_common.wire.kv import AllCleared, BlocksRemoved, BlocksStored, KvBatch
from continuum_testing.kvindex_block_model import NaiveBlocks, batch, make_batches, universe


def unpack(blob: bytes) -> tuple[int, float, int, list[tuple[int, int, list[int]]]]:
    """An independent reading of the documented packed format."""
    epoch = int(blob[:20])
    base, count, more = struct.unpack_from(">dIB", blob, 20)
    pos, events = 33, []
    for _ in range(count):
        kind, tier, n = struct.unpack_from(">BBI", blob, pos)
        pos += 6
        events.append((kind, tier, list(struct.unpack_from(f">{n}Q", blob, pos))))
        pos += 8 * n
    assert pos == len(blob)
    return epoch, base, more, events


def test_pack_layout() -> None:
    top = (1 << 64) - 1
    (part,) = pack_parts(
        batch("a", 7, AllCleared(), BlocksStored([1, top], tier=0), BlocksRemoved([1 << 63], tier=1), epoch=top)
    )
    assert part.packed[:20] == b"18446744073709551615" and part.blocks == 3
    assert unpack(part.packed) == (top, 7 * EVENT_STAMPS, 0, [(3, 0, []), (1, 0, [1, top]), (2, 1, [1 << 63])])
    (keepalive,) = pack_parts(batch("a", 1, epoch=0))
    assert unpack(keepalive.packed) == (0, EVENT_STAMPS, 0, []) and keepalive.blocks == 0
    assert pack_chain([1, 2]) == (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
    assert stamp(3, 2) == 3 * 65_536 + 2


def test_big_batches_are_split_into_parts_with_their_stamps() -> None:
    h = list(range(100, 160))
    events = [
        BlocksStored(h[:5]),
        BlocksRemoved([h[5]]),
        AllCleared(),
        BlocksStored(h[10:30], tier=1),
        BlocksRemoved(h[:3]),
    ]
    parts = pack_parts(batch("a", 2, *events), max_blocks=8)
    assert all(p.blocks <= 8 for p in parts) and sum(p.blocks for p in parts) == 5 + 1 + 20 + 3
    flat = []  # (stamp, kind, tier, hashes) of every event of every part
    for n, part in enumerate(parts):
        _, base, more, body = unpack(part.packed)
        assert more == (n > 0)
        flat += [(int(base) + i, kind, tier, hashes) for i, (kind, tier, hashes) in enumerate(body)]
    base = 2 * EVENT_STAMPS
    assert flat[:3] == [(base, 1, 0, h[:5]), (base + 1, 2, 0, [h[5]]), (base + 2, 3, 0, [])]
    # the 20-hash store is split into pieces of the same stamp; the next event follows it
    assert [f for f in flat if f[1] == 1 and f[2] == 1] == [
        (base + 3, 1, 1, h[10:18]),
        (base + 3, 1, 1, h[18:26]),
        (base + 3, 1, 1, h[26:30]),
    ]
    assert flat[-1] == (base + 4, 2, 0, h[:3])


def test_epoch_digits_sort_like_numbers() -> None:
    epochs = [0, 9, 10, 99, 1_700_000_000_000, (1 << 64) - 1]
    packed = [pack_parts(batch("a", 1, epoch=e))[0].packed[:20] for e in epochs]
    assert packed == sorted(packed)


def test_grouping_keeps_arrival_order_and_splitting_bounds_calls() -> None:
    batches = [batch("b", 2), batch("a", 1), batch("b", 1), batch("a", 3)]
    groups = group_by_backend(batches)
    assert list(groups) == ["b", "a"]
    assert [x.seq for x in groups["b"]] == [2, 1] and [x.seq for x in groups["a"]] == [1, 3]
    sized = [batch("a", i, BlocksStored(list(range(n)))) for i, n in enumerate((3, 3, 5, 1, 1), start=1)]
    assert [[x.seq for x in run] for run in split_by_size(sized, 6, batch_blocks)] == [[1, 2], [3, 4], [5]]
    assert [[x.seq for x in run] for run in split_by_size(sized[2:3], 2, batch_blocks)] == [[3]]  # too big alone
    assert split_by_size([], 6, batch_blocks) == []


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    backends=st.integers(1, 40),
    chain_len=st.integers(0, 30),
)
def test_one_walk_matches_a_brute_force_reading(seed: int, backends: int, chain_len: int) -> None:
    rng = random.Random(seed)
    hashes = universe(40, seed)
    names = [f"b{i}" for i in range(backends)]
    batches = make_batches(rng, backends=names, hashes=hashes, count=backends * 6)
    index = InMemoryBlockIndex()
    index.apply_nowait(batches)
    naive = NaiveBlocks()
    naive.apply_in_order(batches)
    chain = [rng.choice(hashes) for _ in range(chain_len)] if rng.random() < 0.3 else hashes[:chain_len]
    asked = [*rng.sample(names, rng.randint(1, backends)), "unknown"]
    got = index.match_nowait(chain, asked)
    assert list(got) == asked
    assert {b: (m.gpu_blocks, m.any_blocks, m.held_blocks) for b, m in got.items()} == {
        b: naive.match(chain, b) for b in asked
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_expired_backends_free_their_bit_and_their_blocks() -> None:
    clock = Clock()
    index = InMemoryBlockIndex(ttl_seconds=10, clock=clock)
    h = universe(8)
    index.apply_nowait([batch("a", 1, BlocksStored(h[:4])), batch("b", 1, BlocksStored(h[:2]))])
    clock.now += 6
    index.apply_nowait([batch("b", 2)])  # keepalive
    clock.now += 6
    assert await index.cleanup() == 4  # a's four blocks
    assert index.match_nowait(h[:4], ["a", "b"])["b"].gpu_blocks == 2
    index.apply_nowait([batch("c", 1, BlocksStored(h[:3]))])  # reuses a's bit: nothing of a leaks
    got = index.match_nowait(h[:4], ["a", "b", "c"])
    assert [(m.gpu_blocks, m.held_blocks) for m in got.values()] == [(0, 0), (2, 2), (3, 3)]
    clock.now += 11
    assert index.match_nowait(h[:4], ["b", "c"])["c"].generation == 0  # read as expired, dropped
    assert index.stats_nowait().backends == {}


async def test_tombstones_are_bounded_under_heavy_churn() -> None:
    clock = Clock()
    index = InMemoryBlockIndex(max_blocks=100, tombstone_seconds=3600, clock=clock)
    rng = random.Random(1)
    for seq in range(1, 51):
        removed = [rng.getrandbits(64) for _ in range(100)]
        index.apply_nowait([KvBatch("a", 1, seq, 0.0, [BlocksRemoved(removed)])])
    backend = index._backends["a"]  # the bound is internal; this is the one place that looks
    assert sum(len(t.tombs) + len(t.old_tombs) for t in backend.tiers) <= 4 * 100 + 100


def test_reserved_registers_stay_out_of_the_collectors_view_across_epochs_and_expiry() -> None:
    """Registers made before the process freezes its start-up heap are the ones the backends
    fill, and a new epoch or an expiry empties them in place: no dictionary of present blocks
    is made after the freeze, so no full collection walks their entries."""
    clock = Clock()
    index = InMemoryBlockIndex(max_blocks=5_000, ttl_seconds=10, clock=clock)
    index.reserve(2)
    h = universe(3_000)

    def big_dicts() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, OrderedDict) and len(o) >= 1_000)

    gc.freeze()
    try:
        index.apply_nowait([batch("a", 1, BlocksStored(h)), batch("b", 1, BlocksStored(h))])
        index.apply_nowait([batch("a", 1, BlocksStored(h[:2_000]), epoch=2)])  # a restarted engine
        clock.now += 11  # both expire; a third backend comes
        index.apply_nowait([batch("c", 1, BlocksStored(h))])
        assert index.match_nowait(h, ["a", "b", "c"])["c"].gpu_blocks == 3_000
        assert big_dicts() == 0
        index.apply_nowait([batch("d", 1, BlocksStored(h)), batch("e", 1, BlocksStored(h))])
        assert big_dicts() == 1  # d took b's registers, e made its own: only e's are walked
    finally:
        gc.unfreeze()


async def test_match_many_is_match_nowait_per_query() -> None:
    index = InMemoryBlockIndex()
    h = universe(6)
    index.apply_nowait([batch("a", 1, BlocksStored(h[:3]))])
    got = await index.match_many([MatchQuery(h, ["a"]), MatchQuery(h[1:], ["a", "z"])])
    assert [{b: m.gpu_blocks for b, m in r.items()} for r in got] == [{"a": 3}, {"a": 2, "z": 0}]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 100_000), duplicates=st.floats(0.0, 1.0), max_group=st.integers(1, 50))
def test_any_interleaving_equals_in_order_delivery(seed: int, duplicates: float, max_group: int) -> None:
    """The memory index alone, over many more interleavings than the Redis suite can afford
    (tests/integration/test_kvindex_blocks.py runs the same property on all three)."""
    rng = random.Random(seed)
    hashes = universe(16, seed)
    sent = make_batches(rng, backends=("a", "b"), hashes=hashes, count=120)
    delivered = sent + rng.sample(sent, int(len(sent) * duplicates))
    rng.shuffle(delivered)
    index = InMemoryBlockIndex()
    while delivered:
        size = rng.randint(1, max_group)
        index.apply_nowait(delivered[:size])
        delivered = delivered[size:]
    naive = NaiveBlocks()
    naive.apply_in_order(sent)
    for chain in [[h] for h in hashes] + [hashes[:8], hashes[4:12], hashes]:
        got = index.match_nowait(chain, ["a", "b"])
        assert {b: (m.gpu_blocks, m.any_blocks, m.held_blocks) for b, m in got.items()} == {
            b: naive.match(chain, b) for b in ("a", "b")
        }
