"""TensorRT-LLM re-keying (policy.rekey): content keys from tokens, translation of removals and
moves, unknown parents, partial and multimodal blocks, the bound, withdraw and restate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum_common.wire.kv import AllCleared, BlockEvent, BlocksRemoved, BlocksStored
from continuum_listener.policy.rekey import Rekeyer
from continuum_listener.protocol.blocks import EventBuilder, content_digest, content_key
from continuum_listener.protocol.model import Moved, Removed, Stored
from continuum_listener.protocol.trtllm import decode_body

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv-events"
H = json.loads((FIXTURES / "manifest.json").read_text())["hash_inputs"]["vllm"]
T1, T2, T3 = H["T1"], H["T2"], H["T3"]
S1, S2, S3 = 2806306361972916095, 847842904238558909, 7560581105281291331  # SGLang's keys of T1..T3
R3 = content_key(content_digest(None, T3))  # T3 at the root of a chain


def trt_block(block_hash: int, tokens: list[int], level: int = 0, extra: int = 0) -> dict[str, Any]:
    return {
        "type": "stored_block",
        "block_hash": block_hash,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": extra} for t in tokens],
        "cache_level": level,
        "priority": 35,
    }


def trt_stored(parent: int | None, *blocks: dict[str, Any], event_id: int = 1) -> dict[str, Any]:
    return {"event_id": event_id, "data": {"type": "stored", "parent_hash": parent, "blocks": list(blocks)}}


def stored_events(*items: dict[str, Any]) -> list[Stored]:
    body = decode_body(orjson.dumps(list(items)), keep_tokens=True)
    out: list[Stored] = []
    for event in body.events:
        out.extend(e for e in event.events if isinstance(e, Stored))
    return out


def run(rekeyer: Rekeyer, *events: Stored | Removed | Moved) -> tuple[list[BlockEvent], dict[str, int]]:
    out, skipped = EventBuilder(), {}
    for event in events:
        if isinstance(event, Stored):
            rekeyer.stored(event, out, skipped)
        elif isinstance(event, Removed):
            rekeyer.removed(event, out, skipped)
        else:
            rekeyer.moved(event, out, skipped)
    return out.build(), skipped


def test_content_keys_are_sglangs_formula_from_a_real_body_shape() -> None:
    events = stored_events(trt_stored(None, trt_block(9001, T1), trt_block(9002, T2), trt_block(9003, T3)))
    got, skipped = run(Rekeyer(100), *events)
    assert got == [BlocksStored([S1, S2, S3], None, 16, 0)] and skipped == {}


def test_equal_token_prefixes_give_equal_keys_whatever_the_engine_hashes() -> None:
    a, b = Rekeyer(100), Rekeyer(100)
    first, _ = run(a, *stored_events(trt_stored(None, trt_block(1, T1), trt_block(2, T2))))
    # Another engine (or rank) with other opaque hashes, the same tokens, stored in two events.
    second, _ = run(b, *stored_events(trt_stored(None, trt_block(70, T1)), trt_stored(70, trt_block(71, T2))))
    assert first == second == [BlocksStored([S1, S2], None, 16, 0)]
    # The same tokens after another prefix are another block.
    other, _ = run(b, *stored_events(trt_stored(None, trt_block(80, T3), trt_block(81, T2))))
    keys = other[0].hashes  # type: ignore[union-attr]
    assert keys[0] == R3 and keys[1] != S2 and keys[1] == content_key(content_digest(content_digest(None, T3), T2))


def test_removals_and_moves_are_translated() -> None:
    rekeyer = Rekeyer(100)
    run(rekeyer, *stored_events(trt_stored(None, trt_block(1, T1), trt_block(2, T2), trt_block(3, T3, level=1))))
    # TensorRT-LLM removals name no medium: the block leaves every tier it is in.
    got, skipped = run(rekeyer, Removed([3, 1, 404], None))
    assert got == [BlocksRemoved([S1], 0), BlocksRemoved([S3], 1)] and skipped == {"unknown_block": 1}
    assert run(rekeyer, Removed([1], None))[0] == []  # removed twice: nothing more to say
    got, skipped = run(rekeyer, Moved(2, "GPU", "CPU"), Moved(405, "GPU", "CPU"), Moved(2, "CPU", "CPU"))
    assert got == [BlocksStored([S2], S1, 16, 1), BlocksRemoved([S2], 0)] and skipped == {"unknown_block": 1}
    # A removed block still translates for a late child.
    got, _ = run(rekeyer, *stored_events(trt_stored(1, trt_block(5, T3))))
    assert got == [BlocksStored([content_key(content_digest(content_digest(None, T1), T3))], S1, 16, 0)]


def test_unknown_parents_skip_the_event_and_its_descendants() -> None:
    rekeyer = Rekeyer(100)
    got, skipped = run(rekeyer, *stored_events(trt_stored(777, trt_block(1, T1), trt_block(2, T2))))
    assert got == [] and skipped == {"unknown_parent": 2}
    got, skipped = run(rekeyer, *stored_events(trt_stored(2, trt_block(3, T3))))  # its child, later
    assert got == [] and skipped == {"unknown_parent": 1}
    assert len(rekeyer) == 0


def test_partial_and_multimodal_blocks_end_the_chain() -> None:
    rekeyer = Rekeyer(100, block_size=16)
    events = stored_events(trt_stored(None, trt_block(1, T1), trt_block(2, T2[:5]), trt_block(3, T3)))
    got, skipped = run(rekeyer, *events)
    assert got == [BlocksStored([S1], None, 16, 0)] and skipped == {"partial_block": 2}
    events = stored_events(trt_stored(1, trt_block(4, T2, extra=7), trt_block(5, T3)))
    got, skipped = run(rekeyer, *events)
    assert got == [] and skipped == {"unkeyed_block": 2}
    # Without a configured size the largest block seen is the full size.
    learned = Rekeyer(100)
    got, skipped = run(learned, *stored_events(trt_stored(None, trt_block(1, T1)), trt_stored(1, trt_block(2, [1, 2]))))
    assert got == [BlocksStored([S1], None, 16, 0)] and skipped == {"partial_block": 1}


def test_the_bound_withdraws_what_it_forgets() -> None:
    rekeyer = Rekeyer(2)
    got, _ = run(rekeyer, *stored_events(trt_stored(None, trt_block(1, T1), trt_block(2, T2), trt_block(3, T3))))
    assert got == [BlocksStored([S1, S2, S3], None, 16, 0), BlocksRemoved([S1], 0)]
    assert rekeyer.take_pruned() == 1 and rekeyer.take_pruned() == 0
    got, skipped = run(rekeyer, Removed([1], None))
    assert got == [] and skipped == {"unknown_block": 1}


def test_withdraw_restate_and_hash_reuse() -> None:
    rekeyer = Rekeyer(100)
    run(rekeyer, *stored_events(trt_stored(None, trt_block(1, T1), trt_block(2, T2, level=1))))
    out = EventBuilder()
    rekeyer.restate(out)
    assert out.build() == [BlocksStored([S1], None, 16, 0), BlocksStored([S2], S1, 16, 1)]
    # The engine reuses hash 1 for other content: the old key is withdrawn.
    got, _ = run(rekeyer, *stored_events(trt_stored(None, trt_block(1, T3))))
    assert got == [BlocksRemoved([S1], 0), BlocksStored([R3], None, 16, 0)]
    out = EventBuilder()
    rekeyer.withdraw(out)
    assert out.build() == [BlocksRemoved([R3], 0), BlocksRemoved([S2], 1)] and len(rekeyer) == 0


def test_string_and_out_of_range_token_ids_are_unkeyed() -> None:
    body = [
        trt_stored(None, {"block_hash": 1, "tokens": [{"token_id": "abc"}] * 16}),
        trt_stored(None, {"block_hash": 2, "tokens": [{"token_id": 1 << 32}] * 16}, event_id=2),
        trt_stored(None, {"block_hash": 3, "tokens": ["not a token"] * 16}, event_id=3),
    ]
    got, skipped = run(Rekeyer(100), *stored_events(*body))
    assert got == [] and skipped == {"unkeyed_block": 3}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["store", "remove", "move"]), st.integers(0, 12), st.integers(0, 12) | st.none(),
                  st.lists(st.integers(0, 3), min_size=1, max_size=3), st.integers(0, 1)),
        max_size=40,
    ),
    st.integers(1, 8),
)  # fmt: skip
def test_arbitrary_histories_publish_only_known_content(
    ops: list[tuple[str, int, int | None, list[int], int]], capacity: int
) -> None:
    """Whatever the engine says, what was published is exactly what the map holds (never a key
    whose last engine block is gone, never more than the map can translate); nothing raises."""
    rekeyer = Rekeyer(capacity, block_size=2)
    published: set[tuple[int, int]] = set()
    for kind, block, parent, tokens, level in ops:
        out, skipped = EventBuilder(), dict[str, int]()
        if kind == "store":
            toks = [t for t in tokens for _ in range(2)][:2]
            for store in stored_events(trt_stored(parent, trt_block(block, toks, level=level))):
                rekeyer.stored(store, out, skipped)
        elif kind == "remove":
            rekeyer.removed(Removed([block], None), out, skipped)
        else:
            rekeyer.moved(Moved(block, "GPU" if level else "CPU", "CPU" if level else "GPU"), out, skipped)
        for event in out.build():
            if isinstance(event, BlocksStored):
                published.update((k, event.tier) for k in event.hashes)
            elif isinstance(event, BlocksRemoved):
                published.difference_update((k, event.tier) for k in event.hashes)
            else:
                assert isinstance(event, AllCleared)
                published.clear()
        resident = {(e.key, t) for e in rekeyer.entries.values() for t in (0, 1) if e.tiers & (1 << t)}
        assert published == resident
