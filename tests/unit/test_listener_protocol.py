"""Pure decoders: every engine fixture, both replay shapes, TRT-LLM JSON, malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import orjson
import pytest

from continuum_listener.errors import DecodeError
from continuum_listener.protocol.engine import Limits, decode_batch
from continuum_listener.protocol.frames import END_SEQ, parse_pub, parse_replay, replay_request
from continuum_listener.protocol.model import Cleared, Moved, Removed, Stored, medium_tier, norm_hash
from continuum_listener.protocol.trtllm import decode_body

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv-events"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
H = MANIFEST["hash_inputs"]["vllm"]
H1, H2, H3 = H["H1_u64"], H["H2_u64"], H["H3_u64"]
T1, T2, T3 = H["T1"], H["T2"], H["T3"]
U64 = 1 << 64
S1, S2, S3 = 2806306361972916095, 847842904238558909, 7560581105281291331  # SGLang page16
P1, P2, P3 = -8414988064021443811 + U64, 2559240691446296867, -1435765121642336996 + U64  # page1


def shape(event: object) -> tuple[object, ...]:
    if isinstance(event, Stored):
        return ("stored", event.hashes, event.parent, event.spans, event.medium, event.tokens_ok, event.placeholder)
    if isinstance(event, Removed):
        return ("removed", event.hashes, event.medium)
    if isinstance(event, Moved):
        return ("moved", event.hash, event.old_medium, event.new_medium)
    assert isinstance(event, Cleared)
    return ("cleared",)


VLLM_STORED = [
    ("stored", [H1, H2], None, [16, 16], "GPU", True, False),
    ("stored", [H3], H2, [16], "GPU", True, False),
]
VLLM_REMOVED = [("removed", [H3], "GPU")]
SGLANG_16 = [
    ("stored", [S1], None, [16], "GPU", True, False),
    ("stored", [S2], S1, [16], "GPU", True, False),
    ("stored", [S3], S2, [16], "GPU", True, False),
]


def expected_for(path: Path) -> list[tuple[object, ...]]:
    name = path.stem.replace("_byteshash", "").replace("_signedhash", "")
    if path.parent.parent.name == "vllm":
        return {
            "batch_stored": VLLM_STORED,
            "batch_removed": VLLM_REMOVED,
            "batch_cleared": [("cleared",)],
            "batch_mixed": [*VLLM_STORED, *VLLM_REMOVED, ("cleared",)],
            "batch_offload_tiers_example": [
                ("stored", [H1, H2], None, [16, 16], "CPU", True, False),
                ("stored", [H3], None, [0], "FS", False, True),
                ("removed", [H3], "FS"),
            ],
            "batch_stored_extra_keys": [
                ("stored", [2197223920272708758, 16013674178361169814], None, [16, 16], "GPU", True, False)
            ],
        }[name]
    return {
        "batch_cleared": [("cleared",)],
        "batch_stored_page16": SGLANG_16,
        "batch_mixed_page16": [*SGLANG_16, ("removed", [S1, S2, S3], "GPU"), ("cleared",)],
        "batch_removed_page16": [("removed", [S1, S2, S3], "GPU")],
        "batch_stored_host_cpu_pinned": [("stored", [S1], None, [16], "CPU_PINNED", True, False)],
        "batch_stored_page1": [
            ("stored", [P1], None, [1], "GPU", True, False),
            ("stored", [P2], P1, [1], "GPU", True, False),
            ("stored", [P3], P2, [1], "GPU", True, False),
        ],
    }[name]


ALL_FIXTURES = sorted(FIXTURES.glob("*/*/*.msgpack"))


def test_every_fixture_is_covered() -> None:
    assert len(ALL_FIXTURES) == 60


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_decodes_to_expected_events(path: Path) -> None:
    batch = decode_batch(path.read_bytes())
    assert [shape(e) for e in batch.events] == expected_for(path)
    assert batch.skipped == {}
    assert batch.ts == 1767225600.125
    assert batch.rank == (None if "0be6d05" in str(path) else 0)


def test_token_segments_line_up_with_the_scenario() -> None:
    batch = decode_batch((FIXTURES / "vllm/vllm-20260717-426d48b/batch_stored.msgpack").read_bytes())
    first, second = batch.events
    assert isinstance(first, Stored) and isinstance(second, Stored)
    assert first.token_ids == T1 + T2 and second.token_ids == T3


def test_extra_keys_salt_candidate_is_only_cr1_strings() -> None:
    # The fixture's cache_salt is "tenant-a" (not ours): no candidate.
    batch = decode_batch((FIXTURES / "vllm/vllm-20260717-426d48b/batch_stored_extra_keys.msgpack").read_bytes())
    assert isinstance(batch.events[0], Stored) and batch.events[0].salts is None
    salt = "cr1." + "ab" * 32 + "." + "cd" * 16
    payload = msgpack.packb(
        [0.0, [{"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [5] * 32,
                "block_size": 16, "lora_name": "adapter-a",
                "extra_keys": [["adapter-a", ["mmhash", 4], salt], None]}], 0]
    )  # fmt: skip
    event = decode_batch(payload).events[0]
    assert isinstance(event, Stored) and event.salts == [salt] and event.lora_name == "adapter-a"


def test_map_shaped_batch_and_sglang_rank_name() -> None:
    events = [{"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}]
    batch = decode_batch(msgpack.packb({"ts": 2.5, "events": events, "data_parallel_rank": 3}))
    assert batch.rank == 3 and [shape(e) for e in batch.events] == [("removed", [7], "GPU")]
    assert decode_batch(msgpack.packb({"ts": 1, "events": [], "attn_dp_rank": 1})).rank == 1


def test_hash_normalization() -> None:
    assert norm_hash(-1) == U64 - 1
    assert norm_hash(U64 - 1) == U64 - 1
    digest = bytes.fromhex(H["H3_hex"])
    assert norm_hash(digest) == H3  # vLLM's int mode: last 8 bytes, big-endian
    assert norm_hash("ff") == 255
    for bad in (U64, -(1 << 63) - 1, 1.5, True, None, b"", "zz", [1]):
        with pytest.raises(DecodeError):
            norm_hash(bad)


def test_medium_tiers() -> None:
    from continuum_common.events import Tier

    assert medium_tier(None) is Tier.GPU_HOT
    assert medium_tier("gpu") is Tier.GPU_HOT
    for medium in ("CPU", "CPU_PINNED", "DISK", "STORAGE", "FS", "OBJ", "EXTERNAL", "SOMETHING_NEW"):
        assert medium_tier(medium) is Tier.STORAGE_WARM


def test_unknown_tags_and_fields_are_counted_and_ignored() -> None:
    events = [
        ["BlockStored", [1], None, [1, 2], 2, None, "GPU", None, None, 0, "full_attention", None, "future", 9],
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "new_field": 1},
        ["SomethingNew", 1, 2],
        {"type": "AllBlocksCleared"},
    ]
    batch = decode_batch(msgpack.packb([0.0, events, 0]))
    assert [shape(e)[0] for e in batch.events] == ["stored", "removed", "cleared"]
    assert batch.skipped == {"unknown_tag": 1}
    assert batch.unknown_fields == 3


def test_non_main_attention_groups_are_dropped() -> None:
    base = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1], "block_size": 1}
    events = [
        {**base, "kv_cache_spec_kind": "sliding_window", "group_idx": 0},
        {**base, "group_idx": 1},
        {**base, "kv_cache_spec_kind": "mla_attention", "group_idx": 2},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 1},
    ]
    batch = decode_batch(msgpack.packb([0.0, events, 0]))
    assert [shape(e)[0] for e in batch.events] == ["stored"]
    assert batch.skipped == {"attention_group": 3}


def test_block_size_mismatch_keeps_length_without_tokens() -> None:
    event = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2, 3],
             "block_size": 16}  # fmt: skip
    stored = decode_batch(msgpack.packb([0.0, [event], 0])).events[0]
    assert isinstance(stored, Stored)
    assert stored.mismatch and not stored.tokens_ok and stored.spans == [3]
    # A configured block size rejects other full-block sizes but accepts vLLM's partial blocks.
    ok = {**event, "token_ids": [1] * 8, "block_size": 8}
    assert isinstance(s := decode_batch(msgpack.packb([0.0, [ok], 0]), block_size=16).events[0], Stored)
    assert s.tokens_ok
    two = {**event, "block_hashes": [1, 2], "token_ids": [1] * 16, "block_size": 8}
    assert isinstance(s := decode_batch(msgpack.packb([0.0, [two], 0]), block_size=16).events[0], Stored)
    assert s.mismatch and s.spans == [8, 8]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "msgpack"),
        (b"\xc1\xc1\xc1", "msgpack"),
        (msgpack.packb([1.0, [["BlockStored", [1]]]])[:-3], "msgpack"),  # truncated
        (msgpack.packb("not a batch"), "schema"),
        (msgpack.packb(["ts", []]), "schema"),
        (msgpack.packb([1.0, {"a": 1}]), "schema"),
        (msgpack.packb([1.0, [], "rank"]), "schema"),
        (msgpack.packb([1.0, list(range(5000))]), "too_large"),
        (b"\x00" * 100, "msgpack"),  # extra data after a valid object
    ],
)
def test_malformed_payloads_raise_decode_error(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_batch(payload, Limits(max_array=1000))
    assert info.value.reason == reason


def test_wrong_field_types_skip_only_that_event() -> None:
    good = {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}
    events = [
        {"type": "BlockStored", "block_hashes": "x", "parent_block_hash": None, "token_ids": [], "block_size": 1},
        {"type": "BlockStored", "block_hashes": [1.5], "parent_block_hash": None, "token_ids": [], "block_size": 1},
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": {}, "block_size": 1},
        {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1], "block_size": -1},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": 5},
        {"type": 7},
        "string event",
        good,
    ]
    batch = decode_batch(msgpack.packb([0.0, events, 0]))
    assert [shape(e) for e in batch.events] == [("removed", [1], "GPU")]
    assert batch.skipped == {"schema": 7}


def test_too_many_hashes_in_one_event() -> None:
    event = {"type": "BlockRemoved", "block_hashes": list(range(200)), "medium": "GPU"}
    batch = decode_batch(msgpack.packb([0.0, [event], 0]), Limits(max_hashes=100))
    assert batch.events == [] and batch.skipped == {"too_large": 1}


def test_offload_placeholder_detected() -> None:
    batch = decode_batch((FIXTURES / "vllm/vllm-20260717-426d48b/batch_offload_tiers_example.msgpack").read_bytes())
    placeholder = batch.events[1]
    assert isinstance(placeholder, Stored) and placeholder.placeholder and placeholder.token_ids == []


# -- ZMQ frames -------------------------------------------------------------------------------------


def frames(stem: str) -> list[bytes]:
    files = sorted(FIXTURES.glob(f"zmq/{stem}.f*.bin"))
    return [f.read_bytes() for f in files]


@pytest.mark.parametrize("commit", ["vllm-20260512-bcb9c13", "vllm-20260729-48fc2e2"])
def test_captured_pub_frames(commit: str) -> None:
    for seq in range(3):
        frame = parse_pub(frames(f"{commit}.pub.seq{seq}"))
        assert frame.seq == seq
        decode_batch(frame.payload)


@pytest.mark.parametrize("commit", ["vllm-20260512-bcb9c13", "vllm-20260729-48fc2e2"])
def test_captured_replay_replies_both_shapes(commit: str) -> None:
    first = parse_replay(frames(f"{commit}.replay_dealer.msg0"))
    second = parse_replay(frames(f"{commit}.replay_dealer.msg1"))
    assert first is not None and first.seq == 1
    assert second is not None and second.seq == 2
    assert [shape(e) for e in decode_batch(second.payload).events] == [("cleared",)]
    assert parse_replay(frames(f"{commit}.replay_dealer.msg2")) is None


def test_frame_errors() -> None:
    for bad in ([b"t", b"\x00" * 8], [b"t", b"\x00" * 8, b"p", b"x"], [b"t", b"\x00" * 7, b"p"], []):
        with pytest.raises(DecodeError) as info:
            parse_pub(bad)
        assert info.value.reason == "frames"
    with pytest.raises(DecodeError):
        parse_replay([b"", b"a", b"b", b"c", b"d"])
    assert replay_request(5) == [b"", b"\x00" * 7 + b"\x05"]
    # An all-ff seq with a payload is a (bizarre) batch, not the end marker.
    odd = parse_replay([b"", END_SEQ, b"payload"])
    assert odd is not None and odd.seq == U64 - 1


# -- TensorRT-LLM ---------------------------------------------------------------------------------


def test_trtllm_exact_uint64_and_hex_hashes() -> None:
    big = 18446744073709551615
    body = (
        b'[{"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [4, 2]}, "window_size": 32},'
        b' {"event_id": 1, "data": {"type": "stored", "parent_hash": null, "blocks": ['
        b'{"type": "stored_block", "block_hash": 18446744073709551615, "tokens": [{"type": "unique_token",'
        b' "token_id": 1, "token_extra_id": 0}], "cache_level": 0, "priority": 35, "cache_salt": "cr1.x"},'
        b'{"type": "stored_block", "block_hash": 9622824665191806685, "tokens": [], "cache_level": 1, "priority": 35}'
        b']}, "window_size": 32, "attention_dp_rank": 1},'
        b' {"event_id": 2, "data": {"type": "removed", "block_hashes": ["' + b"ab" * 32 + b'"]}},'
        b' {"event_id": 3, "data": {"type": "updated", "block_hash": 5,'
        b' "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0}, "priority": null}},'
        b' {"event_id": 4, "data": {"type": "updated", "block_hash": 5, "cache_level": null,'
        b' "priority": {"type": "event_diff", "new_value": 1, "old_value": 0}}}]'
    )
    out = decode_body(body)
    assert [e.event_id for e in out.events] == [0, 1, 2, 3, 4]
    created, stored, removed, moved, priority = out.events
    assert created.created and [shape(e) for e in created.events] == [("cleared",)]
    assert stored.rank == 1 and stored.window == 32
    assert [shape(e) for e in stored.events] == [
        ("stored", [big], None, [1], "GPU", False, False),
        ("stored", [9622824665191806685], big, [0], "CPU", False, False),
    ]
    first = stored.events[0]
    assert isinstance(first, Stored) and first.salts == ["cr1.x"]
    assert [shape(e) for e in removed.events] == [("removed", [int("ab" * 32, 16)], None)]
    assert [shape(e) for e in moved.events] == [("moved", 5, "GPU", "CPU")]
    assert priority.events == [] and priority.reason is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [(b"not json", "json"), (b'{"event_id": 1}', "schema"), (b"[1", "json")],
)
def test_trtllm_bad_bodies(body: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_body(body)
    assert info.value.reason == reason


def test_trtllm_bad_events_keep_their_id_when_readable() -> None:
    body = orjson.dumps(
        [
            {"event_id": 1, "data": {"type": "stored", "parent_hash": 1.5, "blocks": []}},
            {"event_id": 2, "data": {"type": "teleported"}},
            {"event_id": -3, "data": {"type": "removed", "block_hashes": [1]}},
            "junk",
            {"event_id": 4, "data": {"type": "removed", "block_hashes": [1e30]}},
        ]
    )
    out = decode_body(body)
    assert [(e.event_id, e.reason) for e in out.events] == [(1, "schema"), (2, "unknown_tag"), (4, "schema")]
    assert out.skipped == {"schema": 2}


# -- robustness: nothing but DecodeError escapes the decoders ----------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1), st.floats(),
    st.text(max_size=8), st.binary(max_size=40), st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared",
    "GPU", "CPU", "full_attention", "type", "block_hashes", "token_ids"]),
)  # fmt: skip
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.sampled_from(
        ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "extra_keys",
         "group_idx", "kv_cache_spec_kind", "ts", "events", "lora_name"]), inner, max_size=8),
    max_leaves=40,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, max_size=6), st.floats(allow_nan=False) | st.integers(0, 10))
def test_arbitrary_msgpack_batches_never_raise_anything_else(events: list[object], ts: object) -> None:
    payload = msgpack.packb([ts, events, 0])
    try:
        batch = decode_batch(payload)
    except DecodeError:
        return
    for event in batch.events:
        assert isinstance(event, Stored | Removed | Cleared)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_else(payload: bytes) -> None:
    for decoder in (decode_batch, decode_body):
        try:
            decoder(payload)
        except DecodeError:
            pass


@settings(max_examples=200, deadline=None)
@given(_values)
def test_arbitrary_trtllm_json_never_raises_anything_else(value: object) -> None:
    try:
        body = orjson.dumps([value, {"event_id": 1, "data": value}], option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return
    try:
        decode_body(body)
    except DecodeError:
        pass
