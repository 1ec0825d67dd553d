"""TensorRT-LLM source against a real HTTP server on loopback serving `POST /kv_cache_events`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from continuum_common.config.listener import ListenerSource
from continuum_common.events import KvEvent
from continuum_common.salt import make_salt
from continuum_listener.adapters.trtllm_source import TrtllmSource
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits, State
from continuum_testing.engines import TrtllmServer

SECRET = b"trt-secret"
KEY = bytes(range(32))
OTHER = bytes(range(2, 34))
BIG = 18446744073709551615


class Collect(list[KvEvent]):
    def submit(self, event: KvEvent) -> None:
        self.append(event)

    def take(self) -> list[tuple[str, str, int]]:
        out = [(e.type.value, e.tier.value, e.token_count) for e in self]
        self.clear()
        return out


def block(block_hash: int | str, n_tokens: int, *, level: int = 0, salt: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "stored_block",
        "block_hash": block_hash,
        "tokens": [{"type": "unique_token", "token_id": i, "token_extra_id": 0} for i in range(n_tokens)],
        "cache_level": level,
        "priority": 35,
    }
    if salt is not None:
        out["cache_salt"] = salt
    return out


def ev(event_id: int, data: dict[str, Any], *, rank: int | None = None, window: int | None = 64) -> dict[str, Any]:
    out: dict[str, Any] = {"event_id": event_id, "data": data}
    if window is not None:
        out["window_size"] = window
    if rank is not None:
        out["attention_dp_rank"] = rank
    return out


def created(event_id: int = 0, **kw: Any) -> dict[str, Any]:
    return ev(event_id, {"type": "created", "num_blocks_per_cache_level": [64, 32]}, **kw)


def stored(event_id: int, parent: int | str | None, blocks: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return ev(event_id, {"type": "stored", "parent_hash": parent, "blocks": blocks}, **kw)


def removed_ev(event_id: int, hashes: list[int | str], **kw: Any) -> dict[str, Any]:
    return ev(event_id, {"type": "removed", "block_hashes": hashes}, **kw)


async def eventually(check: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def rig(server: TrtllmServer, url: str | None = None) -> AsyncIterator[tuple[SourcePipeline, Collect]]:
    source = ListenerSource(
        backend_name="trt",
        engine="trtllm",
        publish="prefix",
        trtllm_endpoint=url or f"{server.url}/kv_cache_events",
        allowed_publishers=["127.0.0.1"],
        prefix_key_mode="salt_echo",
        poll_interval_ms=10,
        request_timeout_ms=1000,
    )
    sink = Collect()
    pipeline = SourcePipeline(source, PipelineSettings(Limits(), 0.0, 1024, SECRET), ListenerMetrics(["trt"]), [sink])
    pipeline.start_epoch("start")
    sink.clear()
    poller = TrtllmSource(source, pipeline)
    task = asyncio.create_task(poller.run())
    try:
        yield pipeline, sink
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def push_and_wait(server: TrtllmServer, pipeline: SourcePipeline, body: Any, **kw: Any) -> None:
    server.push(body, **kw)
    await eventually(server.bodies.empty, "the poller to take the body")
    polls = server.polls
    await eventually(lambda: server.polls > polls, "the next poll (the body is applied)")


def dropped(pipeline: SourcePipeline, reason: str) -> float:
    return pipeline.metrics.sample("continuum_kv_event_dropped_total", {"backend": "trt", "reason": reason})


async def test_salted_chain_tiers_and_removal() -> None:
    server = TrtllmServer()
    async with server, rig(server) as (pipeline, sink):
        salt = make_salt(SECRET, "trt", KEY)
        await push_and_wait(server, pipeline, [
            created(0),
            stored(1, None, [block(BIG, 32, salt=salt), block("ab" * 32, 32), block(7, 5)]),  # last block partial
        ])  # fmt: skip
        assert sink.take() == [("created", "gpu_hot", 69)]
        tracker = pipeline.tracker(0)
        assert tracker.chain(7) == [BIG, int("ab" * 32, 16), 7]
        update = {"type": "updated", "block_hash": 7, "priority": None,
                  "cache_level": {"type": "event_diff", "old_value": 0, "new_value": 1}}  # fmt: skip
        await push_and_wait(server, pipeline, [ev(2, update)])
        assert sorted(sink.take()) == [("offloaded", "storage_warm", 69), ("updated", "gpu_hot", 64)]
        await push_and_wait(server, pipeline, [removed_ev(3, [7, "ab" * 32, BIG])])
        assert sorted(sink.take()) == [("evicted", "gpu_hot", 0), ("evicted", "storage_warm", 0)]
        assert pipeline.stats.connected and pipeline.stats.dropped == 0


async def test_unsalted_and_forged_chains_are_discarded() -> None:
    server = TrtllmServer()
    async with server, rig(server) as (pipeline, sink):
        await push_and_wait(server, pipeline, [
            created(0),
            stored(1, None, [block(1, 32), block(2, 32)]),
            stored(2, None, [block(3, 32, salt=make_salt(b"forged", "trt", KEY))]),
            stored(3, None, [block(4, 32, salt=make_salt(SECRET, "other-backend", KEY))]),
            stored(4, 3, [block(5, 32)]),
        ])  # fmt: skip
        assert sink.take() == []
        tracker = pipeline.tracker(0)
        assert all(tracker.blocks[h].state is State.DEAD for h in (1, 2, 3, 4, 5))
        sample = pipeline.metrics.sample
        assert sample("continuum_kv_listener_chain_events_total", {"backend": "trt", "what": "salt_missing"}) == 1
        assert sample("continuum_kv_listener_chain_events_total", {"backend": "trt", "what": "salt_invalid"}) == 2


async def test_duplicates_gaps_restarts_and_ranks() -> None:
    server = TrtllmServer()
    async with server, rig(server) as (pipeline, sink):
        salt_a, salt_b = make_salt(SECRET, "trt", KEY), make_salt(SECRET, "trt", OTHER)
        first = [created(0, rank=0), created(0, rank=1),
                 stored(1, None, [block(1, 16, salt=salt_a)], rank=0),
                 stored(1, None, [block(1, 16, salt=salt_a), block(2, 16)], rank=1)]  # fmt: skip
        await push_and_wait(server, pipeline, first)
        assert sink.take() == [("created", "gpu_hot", 32)]
        await push_and_wait(server, pipeline, first[2:])  # re-delivered events: duplicates
        assert sink.take() == [] and dropped(pipeline, "duplicate") == 2
        # Rank 1 skips ids 2..4: its blocks are withdrawn, rank 0's stay.
        await push_and_wait(server, pipeline, [stored(5, None, [block(9, 16, salt=salt_b)], rank=1)])
        assert sorted(sink.take()) == [("created", "gpu_hot", 16), ("updated", "gpu_hot", 16)]
        assert dropped(pipeline, "replay_lost") == 3
        # Rank 0 restarts (created again): its blocks go; rank 1's chain for OTHER stays.
        await push_and_wait(server, pipeline, [created(0, rank=0)])
        assert sink.take() == [("evicted", "gpu_hot", 0)]
        assert pipeline.book.depth(0, OTHER) == 16


async def test_smaller_windows_are_ignored() -> None:
    server = TrtllmServer()
    async with server, rig(server) as (pipeline, sink):
        salt = make_salt(SECRET, "trt", KEY)
        await push_and_wait(server, pipeline, [
            created(0, window=4096),
            stored(1, None, [block(1, 16, salt=salt)], window=4096),
            stored(2, None, [block(2, 16, salt=salt), block(3, 16)], window=512),
        ])  # fmt: skip
        assert sink.take() == [("created", "gpu_hot", 16)]
        assert dropped(pipeline, "window") == 1


async def test_bad_bodies_statuses_and_redirects_are_counted_and_polling_continues() -> None:
    server, target = TrtllmServer(), TrtllmServer()
    async with server, target, rig(server) as (pipeline, sink):
        await push_and_wait(server, pipeline, b"this is not json")
        await push_and_wait(server, pipeline, b'{"an": "object"}')
        await push_and_wait(server, pipeline, b"[]", status=500)
        target_polls = target.polls
        await push_and_wait(server, pipeline, b"", status=307, headers={"location": f"{target.url}/kv_cache_events"})
        await push_and_wait(server, pipeline, [{"event_id": "one", "data": {}}, created(0)])
        assert dropped(pipeline, "json") == 1
        assert dropped(pipeline, "schema") == 2
        assert dropped(pipeline, "http") == 2
        assert target.polls == target_polls  # the redirect was not followed
        salt = make_salt(SECRET, "trt", KEY)
        await push_and_wait(server, pipeline, [stored(1, None, [block(1, 16, salt=salt)])])
        assert sink.take() == [("created", "gpu_hot", 16)]


async def test_unreachable_endpoint_reports_disconnected_then_recovers() -> None:
    server = TrtllmServer()
    async with server:
        port = server.server.port  # the EmbeddedServer's bound port
    # The server is gone: the poller backs off and reports the source as disconnected.
    async with rig(server) as (pipeline, sink):
        await asyncio.sleep(0.3)
        assert not pipeline.stats.connected
        assert pipeline.metrics.sample("continuum_kv_listener_source_connected", {"backend": "trt"}) == 0
        # An engine comes back on the same address: the poller reconnects and applies events.
        async with TrtllmServer(listen=f"127.0.0.1:{port}") as back:
            await push_and_wait(back, pipeline, [stored(1, None, [block(1, 16, salt=make_salt(SECRET, "trt", KEY))])])
            assert sink.take() == [("created", "gpu_hot", 16)]
            assert pipeline.stats.connected
            assert pipeline.metrics.sample("continuum_kv_listener_source_connected", {"backend": "trt"}) == 1
