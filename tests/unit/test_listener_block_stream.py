"""A source's block output without I/O: numbering, epochs, splitting, keepalive timing, what a
blocks-only source does not build, TensorRT-LLM ranks, resync, and the configuration rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from continuum_common.config.listener import ListenerConfig, ListenerSource
from continuum_common.events import EventType, KvEvent
from continuum_common.wire.kv import AllCleared, BlocksRemoved, BlocksStored, KvBatch
from continuum_listener.block_stream import BlockStream
from continuum_listener.config import problems
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits
from continuum_listener.policy.resident import ResidentBlocks
from continuum_listener.protocol.trtllm import decode_body
from continuum_testing.engines import batch, removed, stored

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv-events"
H = json.loads((FIXTURES / "manifest.json").read_text())["hash_inputs"]["vllm"]
T1, T2 = H["T1"], H["T2"]
S1, S2 = 2806306361972916095, 847842904238558909


class Batches:
    def __init__(self, max_payload: int = 1 << 20) -> None:
        self.max_payload = max_payload
        self.batches: list[KvBatch] = []

    def submit_batch(self, batch: KvBatch) -> None:
        self.batches.append(batch)


class Events:
    def __init__(self) -> None:
        self.events: list[KvEvent] = []

    def submit(self, event: KvEvent) -> None:
        self.events.append(event)


def pipeline(publish: str = "blocks", engine: str = "vllm", **extra: Any) -> tuple[SourcePipeline, Batches, Events]:
    transport: dict[str, Any] = (
        {"trtllm_endpoint": "http://127.0.0.1:9/kv_cache_events", "allowed_publishers": ["127.0.0.1"]}
        if engine == "trtllm"
        else {"zmq_endpoint": "tcp://127.0.0.1:9"}
    )
    source = ListenerSource.model_validate(
        {"backend_name": "b", "engine": engine, "publish": publish, "block_size": 16, "prefix_key_mode": "salt_echo",
         **transport, **extra}
    )  # fmt: skip
    blocks, events = Batches(), Events()
    settings = PipelineSettings(Limits(max_tracked_blocks=100), 0.0, 1024, b"secret")
    pipe = SourcePipeline(source, settings, ListenerMetrics(["b"]), [events], block_sink=blocks)
    pipe.start_epoch("start")
    return pipe, blocks, events


def test_numbering_epochs_and_what_a_blocks_only_source_skips() -> None:
    pipe, sink, events = pipeline()
    pipe.apply_payload(batch([stored([1, 2], None, [1] * 32, 16)]))
    pipe.apply_payload(batch([stored([3], 2, [1] * 3, 3)]))  # partial only: nothing to publish
    pipe.apply_payload(batch([removed([1])]))
    epoch = pipe.sequencer.epoch
    assert [(b.source_epoch, b.seq, b.events) for b in sink.batches] == [
        (epoch, 1, [AllCleared()]),
        (epoch, 2, [BlocksStored([1, 2], None, 16, 0)]),
        (epoch, 3, [BlocksRemoved([1], 0)]),
    ]
    assert events.events == [] and pipe.trackers == {}  # no chain tracker, no prefix-key events
    assert pipe.stats.received == 3 and pipe.stats.dropped == 1
    pipe.start_epoch("gap")
    assert pipe.sequencer.epoch > epoch
    assert [(b.seq, b.events) for b in sink.batches[3:]] == [(1, [AllCleared()])]


def test_both_shares_the_epoch_and_numbers_each_stream() -> None:
    pipe, sink, events = pipeline("both")
    pipe.apply_payload(batch([stored([1], None, [1] * 16, 16, salt="not-a-valid-salt")]))
    assert [e.type for e in events.events] == [EventType.CLEARED]
    assert [b.seq for b in sink.batches] == [1, 2]
    assert {e.source_epoch for e in events.events} == {b.source_epoch for b in sink.batches}


def test_a_batch_over_the_bus_payload_is_split_in_order() -> None:
    source = ListenerSource(backend_name="b", engine="vllm", zmq_endpoint="tcp://127.0.0.1:9")
    sink = Batches(max_payload=1024 + 9 * 10)  # ten hashes per message
    stream = BlockStream("b", sink, ListenerMetrics(["b"]), keepalive=60)
    stream.start_epoch(7)
    stream.publish([BlocksStored(list(range(25)), None, 16, 0)])
    assert [(b.seq, b.events) for b in sink.batches[1:]] == [
        (2, [BlocksStored(list(range(10)), None, 16, 0)]),
        (3, [BlocksStored(list(range(10, 20)), 9, 16, 0)]),
        (4, [BlocksStored(list(range(20, 25)), 19, 16, 0)]),
    ]
    assert source.publish == "blocks"  # the default


def test_keepalive_is_due_after_the_interval_since_the_last_batch() -> None:
    sink = Batches()
    stream = BlockStream("b", sink, ListenerMetrics(["b"]), keepalive=60)
    stream.start_epoch(1)
    now = stream.last_published
    assert stream.keepalive_due(now) == pytest.approx(60) and stream.keepalive_due(now + 61) < 0
    stream.send_keepalive()
    assert sink.batches[-1].events == [] and sink.batches[-1].seq == 2


def trt(pipe: SourcePipeline, items: list[dict[str, Any]]) -> None:
    for event in decode_body(orjson.dumps(items), keep_tokens=True).events:
        pipe.apply_rank(event.rank, event.events)
    pipe.end_batch()


def trt_stored(event_id: int, parent: int | None, blocks: list[tuple[int, list[int]]], rank: int = 0) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "attention_dp_rank": rank,
        "data": {"type": "stored", "parent_hash": parent, "blocks": [
            {"block_hash": h, "tokens": [{"token_id": t} for t in tokens]} for h, tokens in blocks
        ]},
    }  # fmt: skip


def test_trtllm_ranks_withdraw_their_own_blocks_and_resync_restates() -> None:
    pipe, sink, _ = pipeline(engine="trtllm")
    trt(pipe, [trt_stored(1, None, [(11, T1), (12, T2)]), trt_stored(1, None, [(21, T2)], rank=1)])
    root_t2 = sink.batches[-1].events[1].hashes[0]  # type: ignore[union-attr]
    assert sink.batches[-1].events == [BlocksStored([S1, S2], None, 16, 0), BlocksStored([root_t2], None, 16, 0)]
    pipe.reset_rank(1)  # rank 1 lost events: only its blocks go
    pipe.end_batch()
    assert sink.batches[-1].events == [BlocksRemoved([root_t2], 0)]
    pipe.want_resync()
    assert pipe.resync(room=100)
    epoch = pipe.sequencer.epoch
    assert [(b.source_epoch, b.seq, b.events) for b in sink.batches[-2:]] == [
        (epoch, 1, [AllCleared()]),
        (epoch, 2, [BlocksStored([S1, S2], None, 16, 0)]),  # rank 0's blocks, restated
    ]
    assert not pipe.replay_wanted


def test_a_zmq_resync_asks_for_a_replay() -> None:
    pipe, sink, _ = pipeline()
    assert not pipe.resync(room=10)  # nothing wanted
    pipe.want_resync()
    assert pipe.resync(room=10) and pipe.replay_wanted
    assert sink.batches[-1].events == [AllCleared()] and sink.batches[-1].seq == 1


def test_a_zmq_resync_restates_what_the_engine_still_holds() -> None:
    pipe, sink, _ = pipeline()
    pipe.apply_payload(batch([stored([1, 2, 3], None, [1] * 48, 16)]))
    pipe.apply_payload(batch([stored([4], 2, [1] * 16, 16), removed([3])]))
    pipe.apply_payload(batch([stored([9], None, [1] * 16, 16, medium="CPU")]))
    pipe.want_resync()
    assert pipe.resync(room=10) and pipe.replay_wanted
    epoch = pipe.sequencer.epoch
    assert [(b.source_epoch, b.seq, b.events) for b in sink.batches[-2:]] == [
        (epoch, 1, [AllCleared()]),
        # 3 was removed: 1-2 and 4 (stored under 2) are one chain again; the CPU-tier block apart
        (epoch, 2, [BlocksStored([1, 2, 4], None, 16, 0), BlocksStored([9], None, 16, 1)]),
    ]
    pipe.start_epoch("publisher_restart")  # the engine restarted: it holds nothing any more
    pipe.want_resync()
    assert pipe.resync(room=10)
    assert sink.batches[-1].events == [AllCleared()]


def test_resident_blocks_keep_their_order_and_bound() -> None:
    resident = ResidentBlocks(capacity=3)
    resident.apply([BlocksStored([1, 2], None, 16, 0), BlocksStored([3, 4], 2, 16, 0)])
    assert len(resident) == 3 and resident.forgotten == 1  # the oldest (1) went
    assert resident.restate() == [BlocksStored([2, 3, 4], 1, 16, 0)]  # one chain again
    resident.apply([BlocksStored([2], 1, 16, 0)])  # stored again: now the newest
    assert resident.restate() == [BlocksStored([3, 4], 2, 16, 0), BlocksStored([2], 1, 16, 0)]
    resident.apply([BlocksRemoved([3], 0), AllCleared(), BlocksStored([7], None, 32, 0)])
    assert resident.restate() == [BlocksStored([7], None, 32, 0)]
    # a batch that overflows by several blocks forgets that many, the oldest first
    resident.apply([BlocksStored([8, 9, 10, 11], 7, 32, 0)])
    assert resident.forgotten == 3 and resident.restate() == [BlocksStored([9, 10, 11], 8, 32, 0)]


def test_configuration_rules() -> None:
    def cfg(**source: Any) -> ListenerConfig:
        return ListenerConfig.model_validate(
            {"sources": [{"backend_name": "t", "engine": "trtllm", "allowed_publishers": ["10.0.0.1"],
                          "trtllm_endpoint": "http://10.0.0.1:8000/kv_cache_events", **source}]}
        )  # fmt: skip

    assert problems(cfg(), None) == [
        "sources[0].publish: blocks sends block batches to JetStream only; configure bus, or set publish: "
        "prefix for an SSE-only listener"
    ]
    with_bus = cfg().model_copy(update={"bus": ListenerConfig.model_validate({"bus": {}}).bus})
    assert problems(with_bus, None) == []  # a blocks-only TRT-LLM source needs no salt secret
    assert problems(cfg(publish="prefix"), None) == [
        "sources[0].prefix_key_mode: salt echo needs salt.secret_env or salt.secret_file"
    ]
    for bad in ({"publish": "everything"}, {"zmq_rcvhwm": 0}):
        with pytest.raises(ValidationError):
            cfg(**bad)
    with pytest.raises(ValidationError):
        ListenerConfig.model_validate({"limits": {"keepalive_ms": 10}})
