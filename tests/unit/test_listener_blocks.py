"""Engine events → version-2 block events (pure): every fixture, partial blocks, placeholders,
tiers, merging, splitting under the wire bounds, the content hash, and arbitrary input."""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum_common.wire.kv import (
    MAX_EVENTS_PER_BATCH,
    AllCleared,
    BlockEvent,
    BlocksRemoved,
    BlocksStored,
    KvBatch,
    decode_batch,
    encode_batch,
)
from continuum_listener.errors import DecodeError
from continuum_listener.protocol import engine
from continuum_listener.protocol.blocks import (
    BlockMapper,
    EventBuilder,
    content_digest,
    content_key,
    max_hashes_for,
    medium_tier,
    split,
)
from continuum_listener.protocol.fast_blocks import decode_into
from continuum_listener.protocol.model import Stored
from continuum_testing.engines import batch, removed, stored

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv-events"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
H = MANIFEST["hash_inputs"]["vllm"]
H1, H2, H3 = H["H1_u64"], H["H2_u64"], H["H3_u64"]
T1, T2, T3 = H["T1"], H["T2"], H["T3"]
U64 = 1 << 64
S1, S2, S3 = 2806306361972916095, 847842904238558909, 7560581105281291331  # SGLang page16
P1, P2, P3 = -8414988064021443811 + U64, 2559240691446296867, -1435765121642336996 + U64  # page1
ALL_FIXTURES = sorted(FIXTURES.glob("*/*/*.msgpack"))


def blocks_of(payload: bytes, block_size: int | None = None) -> tuple[list[BlockEvent], dict[str, int]]:
    decoded = engine.decode_batch(payload, block_size=block_size)
    out, skipped = EventBuilder(), dict(decoded.skipped)
    BlockMapper(block_size).map(decoded.events, out, skipped)
    return out.build(), skipped


VLLM_STORED = BlocksStored([H1, H2, H3], None, 16, 0)  # two engine events, one chain
SGLANG_STORED = BlocksStored([S1, S2, S3], None, 16, 0)  # one event per page, one chain


def expected_for(path: Path) -> list[BlockEvent]:
    name = path.stem.replace("_byteshash", "").replace("_signedhash", "")
    table: dict[str, list[BlockEvent]]
    if path.parent.parent.name == "vllm":
        table = {
            "batch_stored": [VLLM_STORED],
            "batch_removed": [BlocksRemoved([H3], 0)],
            "batch_cleared": [AllCleared()],
            "batch_mixed": [VLLM_STORED, BlocksRemoved([H3], 0), AllCleared()],
            "batch_offload_tiers_example": [
                BlocksStored([H1, H2], None, 16, 1),  # medium CPU
                BlocksStored([H3], None, 0, 1),  # placeholder on FS: a warm-tier store of a known hash
                BlocksRemoved([H3], 1),
            ],
            "batch_stored_extra_keys": [BlocksStored([2197223920272708758, 16013674178361169814], None, 16, 0)],
        }
        return table[name]
    table = {
        "batch_cleared": [AllCleared()],
        "batch_stored_page16": [SGLANG_STORED],
        "batch_mixed_page16": [SGLANG_STORED, BlocksRemoved([S1, S2, S3], 0), AllCleared()],
        "batch_removed_page16": [BlocksRemoved([S1, S2, S3], 0)],
        "batch_stored_host_cpu_pinned": [BlocksStored([S1], None, 16, 1)],
        "batch_stored_page1": [BlocksStored([P1, P2, P3], None, 1, 0)],
    }
    return table[name]


def test_every_fixture_is_covered() -> None:
    assert len(ALL_FIXTURES) == 60


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_maps_to_expected_block_events(path: Path) -> None:
    block_size = 1 if path.name == "batch_stored_page1.msgpack" else 16
    for configured in (None, block_size):
        events, skipped = blocks_of(path.read_bytes(), configured)
        assert events == expected_for(path)
        assert skipped == {}
        # What goes on the bus decodes back to the same events.
        wire = KvBatch("b", 1, 1, 1.0, events)
        assert decode_batch(encode_batch(wire)) == wire


def test_sglang_hashes_are_the_content_formula() -> None:
    """SGLang's page hash is the formula TRT-LLM blocks are re-keyed with: the fixtures' values."""
    d1 = content_digest(None, T1)
    d2 = content_digest(d1, T2)
    d3 = content_digest(d2, T3)
    assert [content_key(d) for d in (d1, d2, d3)] == [S1, S2, S3]
    assert d1 == hashlib.sha256(struct.pack("<16I", *T1)).digest()
    page1 = content_digest(None, [T1[0]])
    assert content_key(page1) == P1
    assert content_key(content_digest(page1, [T1[1]])) == P2


def test_partial_blocks_are_left_out_and_counted() -> None:
    """vLLM's partial prefix cache: one-hash stores smaller than the source's block size."""
    payload = batch([stored([1, 2], None, [5] * 32, 16), stored([3], 2, [5] * 7, 7), removed([9])])
    events, skipped = blocks_of(payload, 16)
    assert events == [BlocksStored([1, 2], None, 16, 0), BlocksRemoved([9], 0)]
    assert skipped == {"partial_block": 1}
    # Without a configured size the largest block size seen so far is the full size.
    mapper, out, skipped = BlockMapper(), EventBuilder(), {}
    for payload in (batch([stored([1], None, [5] * 16, 16)]), batch([stored([2], 1, [5] * 3, 3)])):
        mapper.map(engine.decode_batch(payload).events, out, skipped)
    assert out.build() == [BlocksStored([1], None, 16, 0)] and skipped == {"partial_block": 1}


def test_tiers_placeholders_and_groups() -> None:
    assert [medium_tier(m) for m in (None, "GPU", "gpu", "DEVICE", "CPU", "DISK", "SOMETHING_NEW")] == [
        0, 0, 0, 0, 1, 1, 1,
    ]  # fmt: skip
    sliding = {**stored([7], None, [1] * 16, 16), "kv_cache_spec_kind": "sliding_window"}
    placeholder = {**stored([8], None, [], 0, medium="CPU")}
    gpu_placeholder = {**stored([9], 8, [], 0, medium=None)}
    events, skipped = blocks_of(batch([sliding, placeholder, gpu_placeholder]), 16)
    # Placeholders keep their medium's tier; the sliding-window group is not a main group.
    assert events == [BlocksStored([8], None, 0, 1), BlocksStored([9], 8, 0, 0)]
    assert skipped == {"attention_group": 1}


def test_merging_keeps_order_and_meaning() -> None:
    out = EventBuilder()
    out.stored([1, 2], None, 16, 0)
    out.stored([3], 2, 16, 0)  # continues the chain: merged
    out.stored([4], 3, 16, 1)  # another tier: not merged
    out.stored([5], 9, 16, 1)  # another parent: not merged
    out.removed([1], 0)
    out.removed([2], 0)  # merged
    out.removed([4], 1)  # another tier
    out.stored([], None, 16, 0)  # nothing
    out.cleared()
    out.cleared()  # said once
    out.stored([6], None, 16, 0)
    assert out.build() == [
        BlocksStored([1, 2, 3], None, 16, 0),
        BlocksStored([4], 3, 16, 1),
        BlocksStored([5], 9, 16, 1),
        BlocksRemoved([1, 2], 0),
        BlocksRemoved([4], 1),
        AllCleared(),
        BlocksStored([6], None, 16, 0),
    ]
    assert out.blocks == 9


def test_split_keeps_chains_and_bounds() -> None:
    events: list[BlockEvent] = [BlocksStored(list(range(10)), 99, 16, 0), AllCleared(), BlocksRemoved([1, 2, 3], 1)]
    assert split(events, 100) == [events]
    chunks = split(events, 4)
    assert chunks == [
        [BlocksStored([0, 1, 2, 3], 99, 16, 0)],
        [BlocksStored([4, 5, 6, 7], 3, 16, 0)],
        [BlocksStored([8, 9], 7, 16, 0), AllCleared(), BlocksRemoved([1, 2], 1)],
        [BlocksRemoved([3], 1)],
    ]
    many: list[BlockEvent] = [BlocksRemoved([i], 0) for i in range(MAX_EVENTS_PER_BATCH + 5)]
    parts = split(many, 1 << 20)
    assert [len(p) for p in parts] == [MAX_EVENTS_PER_BATCH, 5]
    assert max_hashes_for(1 << 20) == 65_536 and max_hashes_for(64 * 1024) == (64 * 1024 - 1024) // 9


def test_a_split_batch_fits_the_bus_payload() -> None:
    hashes = [U64 - 1 - i for i in range(200_000)]  # every hash at its largest encoding
    limit = 1 << 20
    for chunk in split([BlocksStored(hashes, None, 16, 0)], max_hashes_for(limit)):
        assert len(encode_batch(KvBatch("backend-with-a-long-name", 1 << 45, 1 << 40, 1.0, chunk))) <= limit


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("s"), st.lists(st.integers(0, 20), min_size=1, max_size=5), st.integers(0, 20) | st.none(),
                      st.sampled_from([0, 1, 16]), st.integers(0, 1)),
            st.tuples(st.just("r"), st.lists(st.integers(0, 20), min_size=1, max_size=5), st.none(), st.just(0),
                      st.integers(0, 1)),
            st.tuples(st.just("c"), st.just([]), st.none(), st.just(0), st.just(0)),
        ),
        max_size=30,
    ),
    st.integers(1, 7),
)  # fmt: skip
def test_merging_and_splitting_preserve_the_applied_state(
    ops: list[tuple[str, list[int], int | None, int, int]], size: int
) -> None:
    """Applying the merged-and-split events in order gives the same per-tier holdings as
    applying the raw events one by one (a naive model of the block index)."""

    def apply(events: list[BlockEvent]) -> tuple[set[tuple[int, int]], int]:
        held: set[tuple[int, int]] = set()
        count = 0
        for e in events:
            if isinstance(e, AllCleared):
                held.clear()
            elif isinstance(e, BlocksStored):
                held.update((h, e.tier) for h in e.hashes)
                count += len(e.hashes)
            else:
                held.difference_update((h, e.tier) for h in e.hashes)
                count += len(e.hashes)
        return held, count

    raw: list[BlockEvent] = []
    out = EventBuilder()
    for kind, hashes, parent, block_tokens, tier in ops:
        if kind == "s":
            raw.append(BlocksStored(hashes, parent, block_tokens, tier))
            out.stored(hashes, parent, block_tokens, tier)
        elif kind == "r":
            raw.append(BlocksRemoved(hashes, tier))
            out.removed(hashes, tier)
        else:
            raw.append(AllCleared())
            out.cleared()
    built = out.build()
    flat = [e for chunk in split(built, size) for e in chunk]
    assert apply(flat) == apply(built) == apply(raw)
    for chunk in split(built, size):
        assert sum(len(e.hashes) for e in chunk if not isinstance(e, AllCleared)) <= size


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-(1 << 63), (1 << 64) - 1), min_size=1, max_size=4),
    st.integers(0, 40),
    st.sampled_from([None, "GPU", "CPU", "x" * 70]),
    st.integers(-1, 40),
)
def test_arbitrary_stores_map_or_count_never_crash(hashes: list[int], tokens: int, medium: str | None, size: int) -> None:  # fmt: skip
    payload = msgpack.packb([1.0, [["BlockStored", hashes, None, [1] * tokens, size, None, medium]], 0])
    try:
        events, skipped = blocks_of(payload, 16)
    except DecodeError:
        pytest.fail("a bad event must be skipped, not fail the batch")
    assert sum(skipped.values()) + sum(len(e.hashes) for e in events if not isinstance(e, AllCleared)) >= 1
    for event in events:
        assert all(0 <= h < U64 for h in event.hashes)  # type: ignore[union-attr]


# -- the fast path (protocol.fast_blocks) gives what the generic decoder gives ----------------------


def both_paths(payload: bytes, block_size: int | None) -> tuple[object, object]:
    """(generic, fast) as (events, skipped, kinds, mismatches); fast is None when it refused,
    generic is the reason when the whole batch was rejected."""
    fast = fast_path(payload, block_size)
    try:
        decoded = engine.decode_batch(payload, block_size=block_size)
    except DecodeError as exc:
        return exc.reason, fast
    out, skipped = EventBuilder(), dict(decoded.skipped)
    BlockMapper(block_size).map(decoded.events, out, skipped)
    kinds = Counter(type(e).__name__ for e in decoded.events)
    generic = (out.build(), skipped, (kinds["Stored"], kinds["Removed"], kinds["Cleared"]),
               sum(1 for e in decoded.events if isinstance(e, Stored) and e.mismatch))  # fmt: skip
    return generic, fast


def fast_path(payload: bytes, block_size: int | None) -> object:
    out, skipped = EventBuilder(), dict[str, int]()
    result = decode_into(payload, BlockMapper(block_size), out, skipped)
    if result is None:
        assert len(out) == 0 and skipped == {}  # refused before applying anything
        return None
    return out.build(), skipped, (result.stored, result.removed, result.cleared), result.mismatches


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fast_path_takes_the_map_era_and_agrees(path: Path) -> None:
    generic, fast = both_paths(path.read_bytes(), 16 if "page1" not in path.name else 1)
    map_era = path.parent.name in ("vllm-20260609-5b3807e", "vllm-20260717-426d48b")
    assert (fast is not None) == map_era
    if fast is not None:
        assert fast == generic


_map_hash = st.integers(-(1 << 63), (1 << 64) - 1) | st.binary(min_size=0, max_size=66) | st.text(max_size=3)
_map_event = st.fixed_dictionaries(
    {"type": st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "BlockMoved"])},
    optional={
        "block_hashes": st.lists(_map_hash, max_size=4) | st.none(),
        "parent_block_hash": _map_hash | st.none(),
        "token_ids": st.lists(st.integers(0, 200_000), max_size=40) | st.none() | st.integers(0, 9),
        "block_size": st.sampled_from([0, 1, 5, 16, -1]) | st.text(max_size=1),
        "medium": st.sampled_from([None, "GPU", "CPU", "x" * 70]) | st.integers(0, 9),
        "lora_name": st.none() | st.text(max_size=4) | st.integers(0, 9),
        "group_idx": st.sampled_from([None, 0, 1, "0"]),
        "kv_cache_spec_kind": st.sampled_from([None, "full_attention", "sliding_window", 3]),
        "locality": st.none() | st.text(max_size=3),
        "extra_keys": st.none() | st.lists(st.none() | st.lists(st.text(max_size=3), max_size=2), max_size=3),
        "surprise": st.integers(0, 9),
    },
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_map_event, max_size=8), st.sampled_from([None, 16]), st.sampled_from([0, 1, None, "r"]))
def test_fast_path_agrees_with_the_generic_decoder_whenever_it_accepts(
    events: list[dict[str, object]], block_size: int | None, rank: object
) -> None:
    payload = msgpack.packb([1767225600.5, events, rank], use_bin_type=True)
    generic, fast = both_paths(payload, block_size)
    if fast is not None:
        assert fast == generic


_good_hash = st.integers(-(1 << 63), (1 << 64) - 1) | st.binary(min_size=1, max_size=32)
_good_stored = st.builds(
    lambda hashes, parent, size, extra, medium, group, kind, lora: {
        "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
        "token_ids": [7] * (size * len(hashes) + extra) if size or extra else [], "block_size": size,
        "lora_id": None, "medium": medium, "lora_name": lora, "group_idx": group, "kv_cache_spec_kind": kind,
    },
    st.lists(_good_hash, min_size=1, max_size=4), _good_hash | st.none(), st.sampled_from([0, 3, 16, 16, 16]),
    st.sampled_from([0, 0, 0, 1]), st.sampled_from([None, "GPU", "CPU", "cpu_pinned"]), st.sampled_from([None, 0, 1]),
    st.sampled_from([None, "full_attention", "sliding_window"]), st.none() | st.just("adapter"),
)  # fmt: skip
_good_removed = st.builds(
    lambda hashes, medium, group: {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": group},
    st.lists(_good_hash, min_size=1, max_size=3), st.sampled_from([None, "GPU", "CPU"]), st.sampled_from([None, 0, 1]),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_good_stored | _good_removed | st.just({"type": "AllBlocksCleared"}), max_size=10),
    st.sampled_from([None, 16]),
)
def test_fast_path_accepts_well_formed_map_batches_and_agrees(
    events: list[dict[str, object]], block_size: int | None
) -> None:
    payload = msgpack.packb([1767225600.5, events, 0], use_bin_type=True)
    generic, fast = both_paths(payload, block_size)
    assert fast is not None and fast == generic
