"""Hostile engine KV events: vLLM / SGLang msgpack payloads and ZMQ frames, TensorRT-LLM JSON
bodies. Built from the real fixtures (payloads the engines' own encoders made) with structural
and byte-level mutations, plus arbitrary bytes.

* The decoders return a result or raise DecodeError with a reason from DROP_REASONS; nothing
  else escapes (no IndexError, KeyError, TypeError, RecursionError).
* Through the function the source loops call (`SourcePipeline.apply_payload` for ZMQ payloads,
  `TrtllmSource.handle` for a TensorRT-LLM drain response) nothing raises, every refusal is a
  counted drop under its own reason (never `other`, the bug path), and everything published is
  what its consumers decode: each block batch survives the version-2 wire decoder and each
  prefix-key event the version-1 decoder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from continuum_common.config.listener import ListenerSource
from continuum_common.events import KvEvent, decode_event
from continuum_common.wire.kv import KvBatch, encode_batch
from continuum_common.wire.kv import decode_batch as decode_wire_batch
from continuum_listener.adapters.trtllm_source import TrtllmSource
from continuum_listener.errors import DecodeError
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits
from continuum_listener.protocol.blocks import BlockMapper, EventBuilder
from continuum_listener.protocol.engine import decode_batch
from continuum_listener.protocol.fast_blocks import decode_into
from continuum_listener.protocol.frames import parse_pub, parse_replay
from continuum_listener.protocol.model import DROP_REASONS, Cleared, Removed, Stored
from continuum_listener.protocol.trtllm import decode_body
from tests.fuzz.strategies import (
    Deep,
    byte_mutations,
    dump_json,
    fuzz_settings,
    msgpack_hostile,
    mutated,
    pack_msgpack,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv-events"
PAYLOADS = {
    f"{p.parent.name}/{p.name}": p.read_bytes()
    for p in sorted([*FIXTURES.glob("vllm/*/*.msgpack"), *FIXTURES.glob("sglang/*/*.msgpack")])
}
ZMQ_FRAMES = sorted(FIXTURES.glob("zmq/*.bin"))
U64 = 1 << 64
ENGINE_NAMES = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
                "locality", "ts", "events", "data_parallel_rank", "attn_dp_rank", "BlockStored"]  # fmt: skip


def _unpack(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


fixture_values = st.sampled_from(sorted(PAYLOADS)).map(lambda name: _unpack(PAYLOADS[name]))


@st.composite
def engine_payloads(draw: st.DrawFn) -> bytes:
    """A fixture payload mutated as a msgpack tree, as bytes, both, or arbitrary bytes."""
    how = draw(st.sampled_from(["tree", "tree", "tree", "bytes", "both", "random"]))
    if how == "random":
        return draw(st.binary(max_size=400))
    if how == "bytes":
        return draw(byte_mutations(PAYLOADS[draw(st.sampled_from(sorted(PAYLOADS)))]))
    tree = draw(mutated(fixture_values, 4, hostile=msgpack_hostile, names=ENGINE_NAMES))
    payload = pack_msgpack(tree)
    return draw(byte_mutations(payload)) if how == "both" else payload


def check_decoded(payload: bytes, block_size: int | None) -> None:
    try:
        batch = decode_batch(payload, block_size=block_size)
    except DecodeError as exc:
        assert exc.reason in DROP_REASONS, exc.reason
        event(f"refused: {exc.reason}")
        return
    event(f"decoded, {len(batch.events)} events, skipped {sorted(batch.skipped)}")
    assert set(batch.skipped) <= DROP_REASONS, batch.skipped
    for item in batch.events:
        assert isinstance(item, Stored | Removed | Cleared)
        if isinstance(item, Stored | Removed):
            assert item.hashes and all(0 <= h < U64 for h in item.hashes)
        if isinstance(item, Stored):
            assert item.parent is None or 0 <= item.parent < U64
            assert len(item.spans) == len(item.hashes) and all(s >= 0 for s in item.spans)


DEEP_IN_A_FIELD = pack_msgpack(
    [1.5, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": Deep(3000),
            "block_size": 16}], 0]
)  # fmt: skip


@fuzz_settings(3.0)
@given(payload=engine_payloads(), block_size=st.sampled_from([None, 1, 16]))
@example(payload=DEEP_IN_A_FIELD, block_size=None).via("token_ids nested past the recursion limit")
def test_engine_decoder_raises_only_decode_error(payload: bytes, block_size: int | None) -> None:
    check_decoded(payload, block_size)


# -- through the source pipeline ------------------------------------------------------------------


class Collect:
    """The source's sinks: prefix-key events and block batches as they would be published."""

    max_payload = 1 << 20

    def __init__(self) -> None:
        self.events: list[KvEvent] = []
        self.batches: list[KvBatch] = []

    def submit(self, event: KvEvent) -> None:
        self.events.append(event)

    def submit_batch(self, batch: KvBatch) -> None:
        self.batches.append(batch)


def pipeline_for(source: ListenerSource) -> tuple[SourcePipeline, Collect]:
    sink = Collect()
    settings = PipelineSettings(Limits(), 0.0, 1024, b"fuzz-secret")
    pipeline = SourcePipeline(source, settings, ListenerMetrics([source.backend_name]), [sink], block_sink=sink)
    pipeline.start_epoch("start")
    return pipeline, sink


def zmq_source(publish: str) -> ListenerSource:
    return ListenerSource(
        backend_name="b", engine="vllm", publish=publish, model="m", zmq_endpoint="tcp://127.0.0.1:1",  # type: ignore[arg-type]
        prefix_key_mode="salt_echo", block_size=16,
    )  # fmt: skip


def drops(pipeline: SourcePipeline) -> dict[str, float]:
    return {
        r: pipeline.metrics.sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": r})
        for r in DROP_REASONS
    }


def assert_published_is_decodable(sink: Collect) -> None:
    for batch in sink.batches:
        assert decode_wire_batch(encode_batch(batch)) == batch
    for item in sink.events:
        assert decode_event(item.encode()) == item


@fuzz_settings(1.5)
@given(payloads=st.lists(engine_payloads(), min_size=1, max_size=4), publish=st.sampled_from(["blocks", "both"]))
@example(payloads=[DEEP_IN_A_FIELD], publish="blocks").via("the fast decoder on a deep token_ids")
def test_source_pipeline_counts_every_refusal(payloads: list[bytes], publish: str) -> None:
    pipeline, sink = pipeline_for(zmq_source(publish))
    for payload in payloads:
        before = drops(pipeline)
        batches = pipeline.metrics.sample("continuum_kv_listener_batches_total", {"backend": "b"})
        fast = publish == "blocks" and decode_into(payload, BlockMapper(16), EventBuilder(), {}) is not None
        pipeline.apply_payload(payload)
        after = drops(pipeline)
        assert after["other"] == 0, "a payload took the bug path"
        if fast:  # blocks only: vLLM's map era goes through the fast decoder
            continue
        try:
            decode_batch(payload, block_size=16)
        except DecodeError as exc:
            assert after[exc.reason] == before[exc.reason] + 1
            assert pipeline.metrics.sample("continuum_kv_listener_batches_total", {"backend": "b"}) == batches
    assert pipeline.stats.dropped == pytest.approx(sum(drops(pipeline).values()))  # the metric is a float
    event(f"published {min(len(sink.batches), 3)}+ batches, {min(len(sink.events), 3)}+ events")
    assert_published_is_decodable(sink)


# -- ZMQ frames -----------------------------------------------------------------------------------

frame_parts = st.one_of(
    st.binary(max_size=12),
    st.sampled_from([b"", b"kv-events", b"\xff" * 8, b"\x00" * 8, b"\x00" * 7, b"\x00" * 9]),
    st.sampled_from(ZMQ_FRAMES).map(Path.read_bytes),
)


@fuzz_settings(0.5)
@given(frames=st.lists(frame_parts, max_size=5))
def test_frame_parsers_raise_only_decode_error(frames: list[bytes]) -> None:
    for parse in (parse_pub, parse_replay):
        try:
            frame = parse(frames)
        except DecodeError as exc:
            assert exc.reason == "frames"
            continue
        assert frame is None or 0 <= frame.seq < U64


# -- TensorRT-LLM -----------------------------------------------------------------------------------

_token = {"type": "unique_token", "token_id": 1, "token_extra_id": 0}
TRT_BODY: list[dict[str, Any]] = [
    {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [4, 2]}, "window_size": 32},
    {"event_id": 1, "window_size": 32, "attention_dp_rank": 0, "data": {"type": "stored", "parent_hash": None, "blocks": [
        {"type": "stored_block", "block_hash": U64 - 1, "tokens": [_token] * 4, "cache_level": 0, "priority": 35,
         "cache_salt": "cr1.x"},
        {"type": "stored_block", "block_hash": 9622824665191806685, "tokens": [_token] * 4, "cache_level": 1}]}},
    {"event_id": 2, "data": {"type": "removed", "block_hashes": ["ab" * 8, 9622824665191806685]}},
    {"event_id": 3, "data": {"type": "updated", "block_hash": U64 - 1,
                             "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0}}},
    {"event_id": 4, "data": {"type": "updated", "block_hash": 5, "cache_level": None,
                             "priority": {"type": "event_diff", "new_value": 1, "old_value": 0}}},
]  # fmt: skip
TRT_NAMES = ["event_id", "data", "window_size", "attention_dp_rank", "type", "blocks", "block_hash", "block_hashes",
             "parent_hash", "tokens", "token_id", "token_extra_id", "cache_level", "cache_salt", "cacheSalt",
             "old_value", "new_value", "priority"]  # fmt: skip
trt_hostile = st.one_of(
    msgpack_hostile,  # bytes become hex strings, NaN null (_json_safe)
    st.sampled_from(["stored", "removed", "updated", "created", "f" * 16, "f" * 17, "-1", "0x10", "", U64, U64 - 1]),
    st.integers(min_value=U64, max_value=U64 * 10),  # orjson reads these as floats
)


def _json_safe(value: Any) -> Any:
    """msgpack-only values (bytes, NaN, infinities, non-string keys) made JSON-writable."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return 1e308
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


@st.composite
def trtllm_bodies(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["tree", "tree", "tree", "bytes", "random"]))
    if how == "random":
        return draw(st.binary(max_size=300))
    tree = _json_safe(draw(mutated(st.just(TRT_BODY), 4, hostile=trt_hostile, names=TRT_NAMES)))
    body = dump_json(tree)
    return draw(byte_mutations(body)) if how == "bytes" else body


def trt_source(publish: str) -> ListenerSource:
    return ListenerSource(
        backend_name="b", engine="trtllm", publish=publish,  # type: ignore[arg-type]
        trtllm_endpoint="http://127.0.0.1:1/kv_cache_events", allowed_publishers=["127.0.0.1"],
        prefix_key_mode="salt_echo", block_size=4,
    )  # fmt: skip


@fuzz_settings(1.5)
@given(bodies=st.lists(trtllm_bodies(), min_size=1, max_size=4), publish=st.sampled_from(["blocks", "both"]))
def test_trtllm_bodies_decode_or_are_counted(bodies: list[bytes], publish: str) -> None:
    pipeline, sink = pipeline_for(trt_source(publish))
    source = TrtllmSource(pipeline.source, pipeline)
    for body in bodies:
        before = drops(pipeline)
        try:
            decoded = decode_body(body, keep_tokens=publish != "prefix")
        except DecodeError as exc:
            assert exc.reason in DROP_REASONS
            source.handle(body)
            assert drops(pipeline)[exc.reason] == before[exc.reason] + 1
            continue
        assert set(decoded.skipped) <= DROP_REASONS
        assert all(e.reason is None or e.reason in DROP_REASONS for e in decoded.events)
        source.handle(body)
        assert drops(pipeline)["other"] == 0, "a body took the bug path"
    assert pipeline.stats.dropped == pytest.approx(sum(drops(pipeline).values()))  # the metric is a float
    event(f"published {min(len(sink.batches), 3)}+ batches, {min(len(sink.events), 3)}+ events")
    assert_published_is_decodable(sink)


def test_the_mutators_reach_the_interesting_shapes() -> None:
    """The structural mutator starts from every fixture era (a guard against an empty glob)."""
    assert len(PAYLOADS) >= 20 and len(ZMQ_FRAMES) >= 20
    eras = {name.split("/")[0] for name in PAYLOADS}
    assert {"vllm-20250430-0be6d05", "vllm-20260717-426d48b", "sglang-20260723-bd3f6a7"} <= eras
    assert orjson.loads(orjson.dumps(TRT_BODY)) == TRT_BODY
