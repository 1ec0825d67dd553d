"""`GET /events/{backend}` over real HTTP: snapshot, live feed, Last-Event-ID resume, slow
consumers, draining; plus /healthz, /metrics and error bodies."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import zmq
import zmq.asyncio

from continuum_common.config.listener import ListenerConfig
from continuum_common.events import EventType, Tier
from continuum_common.procs import free_port
from continuum_common.salt import make_salt
from continuum_listener.app import ListenerApp, running
from continuum_listener.config import settings_from
from continuum_listener.policy.sequence import EventSequencer
from continuum_testing.engines import EnginePublisher, batch, removed, stored

SECRET = "sse-secret"


def key(i: int) -> bytes:
    return i.to_bytes(32, "big")


@contextlib.asynccontextmanager
async def stack(monkeypatch: Any) -> AsyncIterator[tuple[ListenerApp, EnginePublisher, str]]:
    monkeypatch.setenv("CONTINUUM_SSE_SALT", SECRET)
    port = free_port()
    cfg = ListenerConfig.model_validate(
        {
            "listen": "127.0.0.1:0",
            "salt": {"secret_env": "CONTINUUM_SSE_SALT"},
            "limits": {"coalesce_window_ms": 0, "sse_history": 50},
            "sources": [{"backend_name": "b", "engine": "vllm", "publish": "prefix", "zmq_endpoint": f"tcp://127.0.0.1:{port}",
                         "topic": "kv-events", "prefix_key_mode": "salt_echo"}],
        }
    )  # fmt: skip
    ctx = zmq.asyncio.Context()
    engine = EnginePublisher(ctx, f"tcp://127.0.0.1:{port}")
    try:
        async with running(settings_from(cfg)) as app:
            await engine.wait_subscribed()
            yield app, engine, f"http://127.0.0.1:{app.port}"
    finally:
        await engine.close()
        ctx.destroy(linger=0)


class Sse:
    """Reads SSE records from a streaming httpx response."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()

    async def next(self) -> dict[str, Any]:
        record: dict[str, Any] = {}
        async with asyncio.timeout(5):
            async for line in self.lines:
                if not line:
                    if "event" in record:
                        return record
                    record = {}
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(": ")
                record[name] = orjson.loads(value) if name == "data" else value
        raise EOFError


async def salted(engine: EnginePublisher, block: int, prefix: int, depth_blocks: int = 1) -> None:
    salt = make_salt(SECRET.encode(), "b", key(prefix))
    hashes = list(range(block, block + depth_blocks))
    await engine.send(batch([stored(hashes, None, [1] * 16 * depth_blocks, 16, salt=salt)]))


async def test_snapshot_live_feed_and_resume(monkeypatch: Any) -> None:
    async with stack(monkeypatch) as (app, engine, base), httpx.AsyncClient(base_url=base) as client:
        await salted(engine, 1, 1, 2)
        while app.pipelines["b"].stats.received < 1:
            await asyncio.sleep(0.01)
        epoch = app.pipelines["b"].sequencer.epoch
        async with client.stream("GET", "/events/b") as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            sse = Sse(response)
            # Snapshot: cleared (no id), then the announced state; the last record carries the id.
            first = await sse.next()
            assert first["event"] == "cache_cleared" and "id" not in first
            snap = await sse.next()
            assert snap["event"] == "cache_created" and snap["data"]["token_count"] == 32
            assert snap["id"] == f"{epoch}-2" and snap["data"]["prefix_hash"] == key(1).hex()
            await salted(engine, 10, 2)
            live = await sse.next()
            assert (live["id"], live["event"], live["data"]["event"]) == (
                f"{epoch}-3",
                "cache_created",
                "cache_created",
            )
            await engine.send(batch([removed([2])]))
            await engine.send(batch([removed([1])]))
            assert [(await sse.next())["event"] for _ in range(2)] == ["cache_updated", "cache_evicted"]
        # Resume after id 3: exactly the two later events, then live.
        async with client.stream("GET", "/events/b", headers={"Last-Event-ID": f"{epoch}-3"}) as response:
            sse = Sse(response)
            got = [await sse.next() for _ in range(2)]
            assert [(r["id"], r["event"]) for r in got] == [
                (f"{epoch}-4", "cache_updated"),
                (f"{epoch}-5", "cache_evicted"),
            ]
            await salted(engine, 20, 3)
            assert (await sse.next())["id"] == f"{epoch}-6"
        # An id the history cannot serve (another epoch): a fresh snapshot.
        async with client.stream("GET", "/events/b?last_event_id=1-1") as response:
            sse = Sse(response)
            assert (await sse.next())["event"] == "cache_cleared"
            snap = [await sse.next() for _ in range(2)]
            assert {r["data"]["prefix_hash"] for r in snap} == {key(2).hex(), key(3).hex()}
            assert "id" not in snap[0] and snap[1]["id"] == f"{epoch}-6"


async def test_history_is_bounded_and_old_ids_get_a_snapshot(monkeypatch: Any) -> None:
    async with stack(monkeypatch) as (app, engine, base), httpx.AsyncClient(base_url=base) as client:
        for i in range(60):  # more events than sse_history (50)
            await salted(engine, 100 + i, 100 + i)
        while app.pipelines["b"].stats.received < 60:
            await asyncio.sleep(0.01)
        epoch = app.pipelines["b"].sequencer.epoch
        async with client.stream("GET", "/events/b", headers={"Last-Event-ID": f"{epoch}-2"}) as response:
            sse = Sse(response)
            assert (await sse.next())["event"] == "cache_cleared"
            snapshot = [await sse.next() for _ in range(60)]
            assert {r["data"]["prefix_hash"] for r in snapshot} == {key(100 + i).hex() for i in range(60)}
            assert snapshot[-1]["id"] == f"{epoch}-61" and all("id" not in r for r in snapshot[:-1])
        async with client.stream("GET", "/events/b", headers={"Last-Event-ID": f"{epoch}-55"}) as response:
            sse = Sse(response)
            assert [(await sse.next())["id"] for _ in range(6)] == [f"{epoch}-{s}" for s in range(56, 62)]


async def test_slow_consumer_is_closed_with_buffer_overflow(monkeypatch: Any) -> None:
    async with stack(monkeypatch) as (app, _engine, _base):
        app.hub.client_buffer = 32
        reader, writer = await asyncio.open_connection("127.0.0.1", app.port, limit=1 << 16)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(b"GET /events/b HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        while app.hub.clients("b") == 0:
            await asyncio.sleep(0.01)
        # Stop reading and flood: the per-consumer queue fills once TCP buffers are full.
        reader._transport.pause_reading()  # type: ignore[attr-defined]
        sequencer = EventSequencer("b")
        sequencer.new_epoch()
        for round_ in range(400):
            for i in range(100):
                app.hub.submit(sequencer.make(EventType.CREATED, key(round_ * 100 + i), Tier.GPU_HOT, 16))
            await asyncio.sleep(0)
            if app.metrics.sample(
                "continuum_kv_listener_sse_closed_total", {"backend": "b", "reason": "buffer_overflow"}
            ):
                break
        reader._transport.resume_reading()  # type: ignore[attr-defined]
        body = b""
        async with asyncio.timeout(10):
            while chunk := await reader.read(1 << 16):
                body += chunk
                if b"event: buffer_overflow" in body:
                    break
        writer.close()
        assert b"event: buffer_overflow" in body
        assert (
            app.metrics.sample("continuum_kv_listener_sse_closed_total", {"backend": "b", "reason": "buffer_overflow"})
            == 1
        )


async def test_draining_on_stop_health_metrics_and_errors(monkeypatch: Any) -> None:
    async with stack(monkeypatch) as (app, engine, base), httpx.AsyncClient(base_url=base) as client:
        health = (await client.get("/healthz")).json()
        assert health["status"] == "ok" and health["bus"] is None
        assert health["sources"]["b"]["connected"] is True and health["sources"]["b"]["engine"] == "vllm"
        missing = await client.get("/events/nope")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        assert (await client.post("/events/b")).status_code == 405
        assert (await client.get("/nothing")).json()["error"]["code"] == 404
        await engine.send(b"\xc1 not msgpack", frames=[b"kv-events", (0).to_bytes(8, "big"), b"\xc1"])
        await asyncio.sleep(0.1)
        metrics = (await client.get("/metrics")).text
        assert 'continuum_kv_event_dropped_total{backend="b",reason="msgpack"} 1.0' in metrics
        for _ in range(40):  # the loop-lag timer ticks every 0.1 s
            if "continuum_kv_listener_event_loop_lag_seconds_count 0.0" not in metrics:
                break
            await asyncio.sleep(0.05)
            metrics = (await client.get("/metrics")).text
        assert "continuum_kv_listener_event_loop_lag_seconds_count" in metrics
        assert "continuum_kv_listener_event_loop_lag_seconds_count 0.0" not in metrics
        async with client.stream("GET", "/events/b") as response:
            sse = Sse(response)
            assert (await sse.next())["event"] == "cache_cleared"
            app.stop()
            record = await sse.next()
            assert record["event"] == "draining" and "id" not in record
            with contextlib.suppress(EOFError, httpx.HTTPError):
                await sse.next()
                raise AssertionError("the stream should end after draining")
