"""The whole listener app against a real nats-server: normalized events in JetStream with
de-duplication headers, the heartbeat bucket, and buffering / resync while NATS is down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats
import orjson
import zmq
import zmq.asyncio
from nats.js.api import StreamConfig

from continuum_common.config.listener import ListenerConfig
from continuum_common.events import STREAM_NAME, EventType, KvEvent, decode_event
from continuum_common.procs import NatsServer, free_port
from continuum_common.salt import make_salt
from continuum_listener.app import ListenerApp, running
from continuum_listener.config import settings_from
from continuum_testing.engines import EnginePublisher, batch, removed, stored

SECRET = "js-test-secret"


def key(i: int) -> bytes:
    return i.to_bytes(32, "big")


def listener_config(nats_url: str, zmq_port: int, **limits: Any) -> ListenerConfig:
    return ListenerConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "bus": {"embedded": False, "url": nats_url, "request_timeout_ms": 500,
                    "stream": {"duplicate_window": "30s", "max_age": "10m"}},
            "salt": {"secret_env": "CONTINUUM_TEST_SALT"},
            "limits": {"coalesce_window_ms": 0, **limits},
            "sources": [{"backend_name": "b", "engine": "vllm", "publish": "prefix", "zmq_endpoint": f"tcp://127.0.0.1:{zmq_port}",
                         "topic": "kv-events", "prefix_key_mode": "salt_echo"}],
        }
    )  # fmt: skip


@contextlib.asynccontextmanager
async def stack(nats_url: str, monkeypatch: Any, **limits: Any) -> AsyncIterator[tuple[ListenerApp, EnginePublisher]]:
    monkeypatch.setenv("CONTINUUM_TEST_SALT", SECRET)
    port = free_port()
    cfg = listener_config(nats_url, port, **limits)
    ctx = zmq.asyncio.Context()
    engine = EnginePublisher(ctx, f"tcp://127.0.0.1:{port}")
    try:
        async with running(settings_from(cfg), heartbeat_interval=0.2) as app:
            await engine.wait_subscribed()
            yield app, engine
    finally:
        await engine.close()
        ctx.destroy(linger=0)


async def stream_messages(url: str, *, at_least: int, timeout: float = 10.0) -> list[tuple[KvEvent, dict[str, str]]]:
    nc = await nats.connect(url, connect_timeout=2)
    try:
        js = nc.jetstream()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    info = await js.stream_info(STREAM_NAME)
                    if info.state.messages >= at_least:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.05)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(STREAM_NAME, seq)
            out.append((decode_event(msg.data or b""), dict(msg.headers or {})))
        return out
    finally:
        await nc.close()


async def test_events_reach_jetstream_with_dedup_and_trace_headers(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with stack(nats_server.url, monkeypatch) as (app, engine):
        salt = make_salt(SECRET.encode(), "b", key(1))
        await engine.send(batch([stored([1, 2], None, [5] * 32, 16, salt=salt)]))
        await engine.send(batch([removed([2])]))
        messages = await stream_messages(nats_server.url, at_least=3)
        events = [event for event, _ in messages]
        assert [(e.type, e.token_count) for e in events] == [
            (EventType.CLEARED, 0), (EventType.CREATED, 32), (EventType.UPDATED, 16),
        ]  # fmt: skip
        assert all(e.backend == "b" and e.source_epoch == app.pipelines["b"].sequencer.epoch for e in events)
        assert [e.seq for e in events] == [1, 2, 3]
        assert events[1].prefix_hash == key(1).hex()
        for event, headers in messages:
            assert headers["Nats-Msg-Id"] == f"b:{event.source_epoch}:{event.seq}"
            version, trace, span, flags = headers["traceparent"].split("-")
            assert (version, len(trace), len(span), flags) == ("00", 32, 16, "01")
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            info = await js.stream_info(STREAM_NAME)
            assert info.config.subjects == ["continuum.kv.events.>"] and info.config.duplicate_window == 30.0
            # Re-publishing an event with its Msg-Id inside the duplicate window is a no-op.
            event, headers = messages[1]
            ack = await js.publish(event.subject, event.encode(), headers={"Nats-Msg-Id": headers["Nats-Msg-Id"]})
            assert ack.duplicate and (await js.stream_info(STREAM_NAME)).state.messages == 3
            # Heartbeat: per-source stats in the KV bucket.
            kv = await js.key_value("continuum_listeners")
            async with asyncio.timeout(5):
                while True:
                    entry = await kv.get("b")
                    beat = orjson.loads(entry.value or b"{}")
                    if beat.get("events_received", 0) >= 2:
                        break
                    await asyncio.sleep(0.1)
            assert beat["connected"] is True and beat["backend"] == "b" and beat["events_dropped"] == 0
            assert beat["source_epoch"] == events[0].source_epoch and beat["block_size_mismatches"] == 0
        finally:
            await nc.close()


async def test_existing_stream_is_left_as_configured(nats_server: NatsServer, monkeypatch: Any) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name=STREAM_NAME, subjects=["continuum.kv.events.>"], max_age=5.0))
        async with stack(nats_server.url, monkeypatch) as (_app, _engine):
            await stream_messages(nats_server.url, at_least=1)
        assert (await nc.jetstream().stream_info(STREAM_NAME)).config.max_age == 5.0
    finally:
        await nc.close()


async def test_nats_outage_buffers_then_overflow_resyncs(fresh_nats_server: NatsServer, monkeypatch: Any) -> None:
    server = fresh_nats_server
    async with stack(server.url, monkeypatch, publish_buffer=8) as (app, engine):
        await stream_messages(server.url, at_least=1)  # the start-up `cleared`
        publisher = app.publisher
        assert publisher is not None
        await server.stop()
        async with asyncio.timeout(10):
            while publisher.connected:
                await asyncio.sleep(0.05)
        # Three prefixes grow block by block while NATS is down: 15 events, 8 fit in the buffer.
        salts = [make_salt(SECRET.encode(), "b", key(i)) for i in range(3)]
        for step in range(5):
            events = [
                stored([1000 * i + step], 1000 * i + step - 1 if step else None, [1] * 16, 16,
                       salt=None if step else salts[i])
                for i in range(3)
            ]  # fmt: skip
            await engine.send(batch(events))
        async with asyncio.timeout(10):
            while app.pipelines["b"].stats.received < 15:
                await asyncio.sleep(0.05)
        dropped = app.metrics.sample(
            "continuum_kv_event_dropped_total", {"backend": "b", "reason": "publish_buffer_full"}
        )
        assert dropped == 7
        first_epoch = app.pipelines["b"].sequencer.epoch
        await server.start()  # same port and store: the client reconnects
        async with asyncio.timeout(20):
            while app.pipelines["b"].sequencer.epoch == first_epoch or publisher.pending:
                await asyncio.sleep(0.05)
        messages = await stream_messages(server.url, at_least=1 + 8 + 1 + 3)
        events = [event for event, _ in messages]
        # Old epoch: cleared + the 8 newest buffered events; then a resync epoch restating the
        # three prefixes at their current depth, so the gap left by the drops does not matter.
        old = [e for e in events if e.source_epoch == first_epoch]
        new = [e for e in events if e.source_epoch > first_epoch]
        assert old[0].type is EventType.CLEARED and len(old) == 9
        assert [e.seq for e in old[1:]] == list(range(9, 17))  # seq 2..8 were dropped
        assert new[0].type is EventType.CLEARED and new[0].seq == 1
        assert sorted((e.type, e.prefix_hash, e.token_count) for e in new[1:]) == [
            (EventType.CREATED, key(i).hex(), 80) for i in range(3)
        ]
        assert app.metrics.sample("continuum_kv_listener_epochs_total", {"backend": "b", "reason": "resync"}) == 1
