"""Block mode against real sockets and a real nats-server: one version-2 batch per engine batch
in the stream with its Msg-Id and traceparent, epochs, keepalives, backpressure without drops
while NATS is up, bursts beyond the ZMQ high-water mark recovered by replay (including the tail
of a burst), a NATS outage with resync, bad input, TensorRT-LLM re-keying, `publish: both`, and
/healthz answered while a backlog is worked through."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import msgpack
import nats
import pytest
import zmq
import zmq.asyncio

from continuum_common.config.listener import ListenerConfig, ListenerSource
from continuum_common.events import STREAM_NAME, EventType, KvEvent
from continuum_common.procs import NatsServer, free_port
from continuum_common.salt import make_salt
from continuum_common.wire.kv import (
    AllCleared,
    BlocksRemoved,
    BlocksStored,
    KvBatch,
    decode_batch,
    decode_bus_payload,
)
from continuum_listener.adapters.zmq_source import ZmqSource
from continuum_listener.app import ListenerApp, running
from continuum_listener.config import settings_from
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits
from continuum_testing.engines import EnginePublisher, TrtllmServer, batch, removed, stored

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv-events"
H = json.loads((FIXTURES / "manifest.json").read_text())["hash_inputs"]["vllm"]
T1, T2, T3 = H["T1"], H["T2"], H["T3"]
S1, S2, S3 = 2806306361972916095, 847842904238558909, 7560581105281291331  # content keys of T1..T3


def listener_config(nats_url: str, source: dict[str, Any], **limits: Any) -> ListenerConfig:
    return ListenerConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "bus": {"embedded": False, "url": nats_url, "request_timeout_ms": 500},
            "salt": {"secret_env": "CONTINUUM_TEST_SALT"},
            "limits": {"coalesce_window_ms": 0, **limits},
            "sources": [{"backend_name": "b", "block_size": 16, **source}],
        }
    )


@contextlib.asynccontextmanager
async def stack(
    nats_url: str,
    monkeypatch: Any,
    *,
    replay: bool = False,
    sndhwm: int = 1_000_000,
    source: dict[str, Any] | None = None,
    **limits: Any,
) -> AsyncIterator[tuple[ListenerApp, EnginePublisher]]:
    monkeypatch.setenv("CONTINUUM_TEST_SALT", "blocks-test-secret")
    port, replay_port = free_port(), free_port()
    zmq_source: dict[str, Any] = {"engine": "vllm", "zmq_endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv-events"}
    if replay:
        zmq_source["replay_endpoint"] = f"tcp://127.0.0.1:{replay_port}"
    cfg = listener_config(nats_url, {**zmq_source, **(source or {})}, **limits)
    ctx = zmq.asyncio.Context()
    engine = EnginePublisher(
        ctx, f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if replay else None,
        sndhwm=sndhwm,
    )  # fmt: skip
    try:
        async with running(settings_from(cfg), heartbeat_interval=0.2) as app:
            await engine.wait_subscribed()
            yield app, engine
    finally:
        await engine.close()
        ctx.destroy(linger=0)


async def stream(url: str, *, at_least: int, timeout: float = 15.0) -> list[tuple[KvBatch, dict[str, str]]]:
    """Every message in CONTINUUM_KV (block batches), once there are `at_least`."""
    return [(decode_batch(data), headers) for data, headers in await raw_stream(url, at_least, timeout)]


async def raw_stream(url: str, at_least: int, timeout: float = 15.0) -> list[tuple[bytes, dict[str, str]]]:
    nc = await nats.connect(url, connect_timeout=2)
    try:
        js = nc.jetstream()
        async with asyncio.timeout(timeout):
            while True:
                with contextlib.suppress(Exception):
                    info = await js.stream_info(STREAM_NAME)
                    if info.state.messages >= at_least:
                        break
                await asyncio.sleep(0.05)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(STREAM_NAME, seq)
            out.append((msg.data or b"", dict(msg.headers or {})))
        return out
    finally:
        await nc.close()


async def wait_for(condition: Any, what: str, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


def stored_hashes(batches: list[KvBatch]) -> list[int]:
    return [h for b in batches for e in b.events if isinstance(e, BlocksStored) for h in e.hashes]


def big_batch(first: int, blocks: int, block_size: int = 16) -> bytes:
    """One engine batch storing `blocks` new hashes (token ids of 5 msgpack bytes each)."""
    hashes = list(range(first, first + blocks))
    return batch([stored(hashes, None, [100_000] * block_size * blocks, block_size)])


async def test_one_batch_per_engine_batch_with_ids_epochs_and_trace(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with stack(nats_server.url, monkeypatch) as (app, engine):
        await engine.send(batch([stored([1, 2], None, [5] * 32, 16), stored([3], 2, [5] * 16, 16), removed([2])]))
        await engine.send(batch([stored([4], 3, [5] * 5, 5)]))  # a vLLM partial block: nothing to publish
        await engine.send(batch([stored([9], None, [], 0, medium="CPU"), {"type": "AllBlocksCleared"}]))
        messages = await stream(nats_server.url, at_least=3)
        epoch = app.pipelines["b"].sequencer.epoch
        assert [(m.source_epoch, m.seq, m.events) for m, _ in messages] == [
            (epoch, 1, [AllCleared()]),  # every epoch starts with AllCleared
            (epoch, 2, [BlocksStored([1, 2, 3], None, 16, 0), BlocksRemoved([2], 0)]),
            (epoch, 3, [BlocksStored([9], None, 0, 1), AllCleared()]),
        ]
        for message, headers in messages:
            assert headers["Nats-Msg-Id"] == f"b:{epoch}:b{message.seq}" == message.msg_id
            version, trace, span, flags = headers["traceparent"].split("-")
            assert (version, len(trace), len(span), flags) == ("00", 32, 16, "01")
        sample = app.metrics.sample
        assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "partial_block"}) == 1
        assert sample("continuum_kv_listener_blocks_total", {"backend": "b", "kind": "stored"}) == 4
        assert sample("continuum_kv_listener_blocks_total", {"backend": "b", "kind": "removed"}) == 1
        assert sample("continuum_kv_listener_block_batches_total", {"backend": "b"}) == 3
        # The engine restarts (seq from 0): a new epoch, announced by AllCleared.
        engine.restart()
        await engine.send(batch([stored([7], None, [5] * 16, 16)]))
        messages = await stream(nats_server.url, at_least=5)
        new_epoch = app.pipelines["b"].sequencer.epoch
        assert new_epoch > epoch
        assert [(m.source_epoch, m.seq, m.events) for m, _ in messages[3:]] == [
            (new_epoch, 1, [AllCleared()]),
            (new_epoch, 2, [BlocksStored([7], None, 16, 0)]),
        ]
        # The SSE feed carries prefix-key events; a blocks-only source says so.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.port}") as client:
            response = await client.get("/events/b")
            assert response.status_code == 404 and "publish: blocks" in response.json()["error"]["message"]
            health = (await client.get("/healthz")).json()
            assert health["sources"]["b"]["publish"] == "blocks" and health["sources"]["b"]["block_seq"] == 2
            assert health["bus"]["backpressure"] is False


async def test_keepalives_while_the_engine_is_connected(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with stack(nats_server.url, monkeypatch, keepalive_ms=200) as (app, engine):
        messages = await stream(nats_server.url, at_least=4)  # start + keepalives
        assert messages[0][0].events == [AllCleared()]
        assert all(m.events == [] for m, _ in messages[1:4]) and [m.seq for m, _ in messages[:4]] == [1, 2, 3, 4]
        # A batch resets the timer; a gone engine gets none (the index lets it expire).
        await engine.close()
        await wait_for(lambda: not app.pipelines["b"].stats.connected, "the engine is gone")
        count = len(await stream(nats_server.url, at_least=1))
        await asyncio.sleep(0.7)
        assert len(await stream(nats_server.url, at_least=1)) == count
        assert app.metrics.sample("continuum_kv_listener_keepalives_total", {"backend": "b"}) >= 3


async def test_backpressure_pauses_reading_and_drops_nothing(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with stack(nats_server.url, monkeypatch, publish_buffer=4, max_outstanding_acks=1) as (app, engine):
        for i in range(300):
            await engine.send(batch([stored([1000 + i], None, [3] * 16, 16)]))
        messages = await stream(nats_server.url, at_least=301)
        assert sorted(stored_hashes([m for m, _ in messages])) == list(range(1000, 1300))
        assert [m.seq for m, _ in messages] == list(range(1, 302))
        sample = app.metrics.sample
        assert sample("continuum_kv_listener_backpressure_pauses_total", {"backend": "b"}) >= 1
        assert sample("continuum_kv_listener_backpressure_seconds_total", {"backend": "b"}) > 0
        assert app.pipelines["b"].stats.dropped == 0


async def test_a_burst_beyond_the_high_water_marks_is_recovered_by_replay(
    nats_server: NatsServer, monkeypatch: Any
) -> None:
    """~18 MB sent at once against high-water marks of one message, while the listener
    publishes one batch at a time: the PUB must drop, and replay brings every batch back."""
    async with stack(
        nats_server.url, monkeypatch, replay=True, sndhwm=1, source={"zmq_rcvhwm": 1},
        publish_buffer=2, max_outstanding_acks=1,
    ) as (app, engine):  # fmt: skip
        for i in range(300):
            await engine.send(big_batch(i * 1000, 1000))
        total = 300 * 1000
        await wait_for(lambda: app.metrics.sample("continuum_kv_listener_blocks_total",
                                                  {"backend": "b", "kind": "stored"}) >= total, "all blocks", 60)  # fmt: skip
        messages = await stream(nats_server.url, at_least=301)
        assert sorted(stored_hashes([m for m, _ in messages])) == list(range(total))
        assert len({m.source_epoch for m, _ in messages}) == 1
        assert app.metrics.sample("continuum_kv_listener_replays_total", {"backend": "b", "outcome": "recovered"}) >= 1
        assert app.pipelines["b"].stats.dropped == 0


class Batches:
    """A block sink that keeps what it is given (the publisher is not what these tests test)."""

    max_payload = 1 << 20

    def __init__(self) -> None:
        self.batches: list[KvBatch] = []

    def submit_batch(self, batch: KvBatch) -> None:
        self.batches.append(batch)


def resident(batches: list[KvBatch]) -> set[int]:
    """The blocks a consumer applying `batches` in order ends up holding."""
    held: set[int] = set()
    for b in batches:
        for event in b.events:
            if isinstance(event, BlocksStored):
                held.update(event.hashes)
            elif isinstance(event, BlocksRemoved):
                held.difference_update(event.hashes)
            else:
                held.clear()
    return held


@contextlib.asynccontextmanager
async def direct_source(
    quiet: float = 0.05,
) -> AsyncIterator[tuple[SourcePipeline, Batches, Callable[[], Awaitable[EnginePublisher]]]]:
    """A ZMQ source whose block batches land in a list, and a factory of engines on its address
    (each call a new incarnation: new sockets, seq from 0). `quiet`: the tail check's wait."""
    ctx = zmq.asyncio.Context()
    port, replay_port = free_port(), free_port()
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    source = ListenerSource(backend_name="b", engine="vllm", zmq_endpoint=endpoint, topic="kv-events",
                            replay_endpoint=replay, block_size=16)  # fmt: skip
    sink = Batches()
    pipeline = SourcePipeline(source, PipelineSettings(Limits(), 0.0, 1024, None), ListenerMetrics(["b"]), [],
                              block_sink=sink)  # fmt: skip
    pipeline.start_epoch("start")
    engines: list[EnginePublisher] = []

    async def engine() -> EnginePublisher:
        # ZMQ releases a closed socket's port in its I/O thread, a moment after close()
        async with asyncio.timeout(5):
            while True:
                try:
                    engines.append(EnginePublisher(ctx, endpoint, replay_endpoint=replay))
                    return engines[-1]
                except zmq.ZMQError:
                    await asyncio.sleep(0.02)

    task = asyncio.create_task(ZmqSource(ctx, source, pipeline, quiet=quiet).run())
    try:
        yield pipeline, sink, engine
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for e in engines:
            await e.close()
        ctx.destroy(linger=0)


def one(block: int) -> bytes:
    return batch([stored([block], None, [1] * 16, 16)])


async def test_the_tail_of_a_burst_comes_back_without_a_later_batch() -> None:
    async with direct_source(quiet=1.0) as (pipeline, sink, make_engine):
        engine = await make_engine()
        await engine.wait_subscribed()
        for i in range(3):
            await engine.send(one(i))
        engine.skip(one(3))  # dropped by the PUB
        await engine.send(one(4))  # the gap shows: replayed
        await wait_for(lambda: stored_hashes(sink.batches) == [0, 1, 2, 3, 4], "the gap replayed")
        for i in (5, 6, 7):  # the burst's tail: dropped too, and no later batch shows it
            engine.skip(one(i))
        await wait_for(lambda: stored_hashes(sink.batches) == list(range(8)), "the tail checked")
        assert engine.replay_requests == [2, 4]  # each from the last batch applied, to compare it
        # Live copies of replayed batches (still on their way) are duplicates, not a restart.
        await engine.send(b"", frames=[b"kv-events", (6).to_bytes(8, "big"), one(6)])
        await engine.send(one(8))
        await wait_for(lambda: stored_hashes(sink.batches) == list(range(9)), "the next live batch")
        assert {b.source_epoch for b in sink.batches} == {pipeline.sequencer.epoch}
        assert pipeline.stats.dropped == 0


@pytest.mark.parametrize("published_before", [5, 7])
async def test_an_engine_restarted_at_the_same_address_is_told_apart_by_its_buffer(published_before: int) -> None:
    """The new incarnation publishes `published_before` batches before the listener sees one:
    its next live seq is then exactly the one expected (5) or past it (7). Either way the SUB's
    reconnect has the listener compare its last batch with the engine's buffer, and the old
    incarnation's blocks are cleared."""
    async with direct_source() as (pipeline, sink, engine):
        old = await engine()
        await old.wait_subscribed()
        for i in range(5):  # seq 0..4
            await old.send(one(i))
        await wait_for(lambda: resident(sink.batches) == {0, 1, 2, 3, 4}, "the first incarnation")
        first_epoch = pipeline.sequencer.epoch
        await old.close()
        new = await engine()
        for i in range(published_before):  # never seen live
            new.skip(one(100 + i))
        await new.wait_subscribed()
        # the reconnect alone, before any live batch: the old blocks go, the new buffer comes
        replayed = set(range(100, 100 + published_before))
        await wait_for(lambda: resident(sink.batches) == replayed, "the restart seen on reconnect")
        await new.send(one(200))
        await wait_for(lambda: resident(sink.batches) == {*replayed, 200}, "the new incarnation alone")
        assert pipeline.sequencer.epoch > first_epoch
        sample = pipeline.metrics.sample
        assert sample("continuum_kv_listener_epochs_total", {"backend": "b", "reason": "publisher_restart"}) == 1
        assert sample("continuum_kv_listener_replays_total", {"backend": "b", "outcome": "restarted"}) == 1
        assert pipeline.stats.dropped == 0


async def test_a_resync_after_an_unseen_restart_restates_nothing_of_the_old_engine() -> None:
    """A resync (a consumer lost the backend's history) replays the engine's buffer up to the
    last seq seen. When the engine restarted meanwhile, unseen (no reconnect: the same sockets,
    its first batches lost in transit), that buffer ends early: a restart, not lost batches."""
    async with direct_source() as (pipeline, sink, engine):
        e = await engine()
        await e.wait_subscribed()
        for i in range(5):
            await e.send(one(i))
        await wait_for(lambda: resident(sink.batches) == {0, 1, 2, 3, 4}, "the first incarnation")
        e.restart()
        e.skip(one(100))  # seq 0 and 1 of the new incarnation: dropped by its PUB
        e.skip(one(101))
        pipeline.want_resync()
        assert pipeline.resync(room=1024)
        await wait_for(lambda: resident(sink.batches) == {100, 101}, "restated from the new buffer")
        await e.send(one(102))  # seq 2: the next one expected
        await wait_for(lambda: resident(sink.batches) == {100, 101, 102}, "the next live batch")
        sample = pipeline.metrics.sample
        assert sample("continuum_kv_listener_epochs_total", {"backend": "b", "reason": "publisher_restart"}) == 1
        assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "replay_lost"}) == 0


async def test_a_reconnect_to_the_same_engine_restarts_nothing() -> None:
    """A reconnect alone (the engine kept running) is checked the same way and changes nothing:
    the compared batch matches, and what the engine published meanwhile is caught up."""
    async with direct_source() as (pipeline, sink, engine):
        e = await engine()
        await e.wait_subscribed()
        for i in range(3):
            await e.send(one(i))
        await wait_for(lambda: resident(sink.batches) == {0, 1, 2}, "applied")
        epoch = pipeline.sequencer.epoch
        # The same engine on new sockets, its seq and buffer kept (to the SUB, a network blip
        # looks the same)
        await e.close()
        same = await engine()
        same.seq, same.buffer = e.seq, e.buffer
        same.skip(one(3))  # published while the SUB was away
        await same.wait_subscribed()
        await wait_for(lambda: resident(sink.batches) == {0, 1, 2, 3}, "caught up on reconnect")
        assert pipeline.sequencer.epoch == epoch
        assert (
            pipeline.metrics.sample("continuum_kv_listener_replays_total", {"backend": "b", "outcome": "restarted"})
            == 0
        )


async def test_nats_outage_overflow_resyncs_by_replaying_the_engine(
    fresh_nats_server: NatsServer, monkeypatch: Any
) -> None:
    server = fresh_nats_server
    async with stack(server.url, monkeypatch, replay=True, publish_buffer=4) as (app, engine):
        await engine.send(batch([stored([100], None, [1] * 16, 16)]))
        await stream(server.url, at_least=2)
        publisher = app.publisher
        assert publisher is not None
        await server.stop()
        await wait_for(lambda: not publisher.connected, "NATS is gone")
        for i in range(1, 11):  # the listener keeps reading while NATS is down: 10 batches, 4 fit
            await engine.send(batch([stored([100 + i], 100 + i - 1, [1] * 16, 16)]))
        pipeline = app.pipelines["b"]
        await wait_for(lambda: pipeline.stats.received >= 11, "all applied")
        assert (
            app.metrics.sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "publish_buffer_full"})
            == 6
        )
        first_epoch = pipeline.sequencer.epoch
        await server.start()
        await wait_for(lambda: pipeline.sequencer.epoch > first_epoch and not publisher.pending, "resynced", 30)
        await wait_for(lambda: app.metrics.sample("continuum_kv_listener_blocks_total",
                                                  {"backend": "b", "kind": "stored"}) >= 11 + 11, "restated")  # fmt: skip
        messages = [m for m, _ in await stream(server.url, at_least=1)]
        new = [m for m in messages if m.source_epoch > first_epoch]
        # The new epoch: AllCleared, then the engine's buffer replayed — every block it stored.
        assert new[0].seq == 1 and new[0].events == [AllCleared()]
        assert sorted(set(stored_hashes(new))) == list(range(100, 111))
        assert app.metrics.sample("continuum_kv_listener_epochs_total", {"backend": "b", "reason": "resync"}) == 1


async def test_bad_input_is_counted_and_enormous_batches_are_split(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with stack(nats_server.url, monkeypatch, source={"block_size": 4}) as (app, engine):
        await engine.send(b"", frames=[b"kv-events", b"\x00" * 8])  # two frames
        await engine.send(b"\xc1garbage")  # not msgpack
        await engine.send(msgpack.packb([1.0, [["NoSuchEvent", 1], ["BlockStored", "not hashes"]], 0]))
        await engine.send(big_batch(0, 70_000, 4))  # more hashes than one bus message carries
        await engine.send(batch([removed([5])]))
        messages = [m for m, _ in await stream(nats_server.url, at_least=4)]
        assert [m.seq for m in messages] == [1, 2, 3, 4]
        first, second = messages[1].events[0], messages[2].events[0]
        assert isinstance(first, BlocksStored) and isinstance(second, BlocksStored)
        assert first.hashes + second.hashes == list(range(70_000)) and second.parent == first.hashes[-1]
        assert messages[3].events == [BlocksRemoved([5], 0)]
        sample = app.metrics.sample
        assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "frames"}) == 1
        assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "msgpack"}) == 1
        assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "unknown_tag"}) == 1
        assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "schema"}) == 1


async def test_both_publishes_prefix_events_and_block_batches(nats_server: NatsServer, monkeypatch: Any) -> None:
    secret = b"blocks-test-secret"
    key = bytes(range(32))
    source = {"publish": "both", "prefix_key_mode": "salt_echo"}
    async with stack(nats_server.url, monkeypatch, source=source) as (app, engine):
        await engine.send(batch([stored([1, 2], None, [5] * 32, 16, salt=make_salt(secret, "b", key))]))
        decoded = [decode_bus_payload(data) for data, _ in await raw_stream(nats_server.url, 4)]
        v1 = [d for d in decoded if isinstance(d, KvEvent)]
        v2 = [d for d in decoded if isinstance(d, KvBatch)]
        assert [(e.type, e.prefix_hash, e.token_count) for e in v1] == [
            (EventType.CLEARED, None, 0), (EventType.CREATED, key.hex(), 32),
        ]  # fmt: skip
        assert [b.events for b in v2] == [[AllCleared()], [BlocksStored([1, 2], None, 16, 0)]]
        epoch = app.pipelines["b"].sequencer.epoch
        assert {e.source_epoch for e in v1} == {b.source_epoch for b in v2} == {epoch}
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.port}")
        async with client, client.stream("GET", "/events/b") as response:
            assert response.status_code == 200


async def test_healthz_is_answered_while_a_backlog_is_worked_through(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with stack(nats_server.url, monkeypatch) as (app, engine):
        assert app.http._sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on such sockets
        events = [removed([i]) for i in range(200)]
        for i in range(2000):  # queued in the SUB before the listener gets to most of them
            await engine.send(batch([stored([10_000 + i], None, [1] * 16, 16), *events]))
        pipeline = app.pipelines["b"]
        during: list[int] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.port}") as client:
            while pipeline.stats.received < 2000 * 201:
                assert (await client.get("/healthz")).status_code == 200
                during.append(pipeline.stats.received)
        # Answers came while the backlog was being applied, not only after it.
        assert len({n for n in during if 0 < n < 2000 * 201}) >= 5


async def test_trtllm_blocks_are_rekeyed_by_content(nats_server: NatsServer, monkeypatch: Any) -> None:
    def block(h: int, tokens: list[int]) -> dict[str, Any]:
        return {"block_hash": h, "tokens": [{"token_id": t, "token_extra_id": 0} for t in tokens], "cache_level": 0}

    server = TrtllmServer()
    async with server:
        source = {"engine": "trtllm", "trtllm_endpoint": f"{server.url}/kv_cache_events",
                  "allowed_publishers": ["127.0.0.1"], "poll_interval_ms": 10}  # fmt: skip
        cfg = listener_config(nats_server.url, source)
        monkeypatch.setenv("CONTINUUM_TEST_SALT", "unused")
        async with running(settings_from(cfg)) as app:
            server.push([
                {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [8, 0]}},
                {"event_id": 1, "data": {"type": "stored", "parent_hash": None,
                                         "blocks": [block(901, T1), block(902, T2)]}},
                {"event_id": 2, "data": {"type": "stored", "parent_hash": 555, "blocks": [block(903, T3)]}},
            ])  # fmt: skip
            server.push([
                {"event_id": 3, "data": {"type": "stored", "parent_hash": 902, "blocks": [block(904, T3)]}},
                {"event_id": 4, "data": {"type": "removed", "block_hashes": [902, 777]}},
            ])  # fmt: skip
            messages = [m for m, _ in await stream(nats_server.url, at_least=3)]
            assert [m.events for m in messages] == [
                [AllCleared()],
                [AllCleared(), BlocksStored([S1, S2], None, 16, 0)],  # `created` clears the (only) rank
                [BlocksStored([S3], S2, 16, 0), BlocksRemoved([S2], 0)],
            ]
            sample = app.metrics.sample
            assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "unknown_parent"}) == 1
            assert sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "unknown_block"}) == 1
