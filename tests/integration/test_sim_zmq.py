"""KV events over real ZMQ sockets: PUB frames and DEALER replay against vLLM's own captures, and
events of real requests decoded and re-hashed from the engine's /tokenize output."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import msgpack
import pytest
import pytest_asyncio
import zmq
import zmq.asyncio

from continuum_common.procs import free_port
from continuum_sim import EngineConfig, KvEventsConfig, SimFleet
from continuum_sim.adapters.zmq_publisher import ZmqEventPublisher
from continuum_sim.metrics import EngineMetrics
from continuum_sim.protocol.block_hash import (
    chain_hashes,
    none_hash,
    sglang_page_digest,
    sglang_wire_hash,
    vllm_wire_hash,
)
from continuum_sim.protocol.kv_wire import ClearedEvent, RemovedEvent, StoredEvent
from continuum_testing.sim_fixtures import FIXTURE_TS, HASH_INPUTS, zmq_frames

CAPTURES = {"array": "vllm-20260512-bcb9c13", "map": "vllm-20260729-48fc2e2"}
RECV_TIMEOUT = 5.0


@pytest_asyncio.fixture(loop_scope="session")
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def recv(sock: zmq.asyncio.Socket) -> list[bytes]:
    return await asyncio.wait_for(sock.recv_multipart(), RECV_TIMEOUT)


def subscriber(ctx: zmq.asyncio.Context, endpoint: str, topic: bytes = b"") -> zmq.asyncio.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    return sub


@pytest.mark.parametrize("era", ["array", "map"])
async def test_pub_frames_and_dealer_replay_match_vllm_captures(ctx: zmq.asyncio.Context, era: str) -> None:
    ticks = itertools.count()
    config = KvEventsConfig(topic="kv-events", era=era)  # type: ignore[arg-type]
    publisher = ZmqEventPublisher(config, EngineMetrics("m"), ctx, clock=lambda: FIXTURE_TS + next(ticks))
    await publisher.start()
    assert publisher.endpoint and publisher.replay_endpoint
    sub = subscriber(ctx, publisher.endpoint, b"kv-events")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(publisher.replay_endpoint)
    try:
        await asyncio.sleep(0.1)
        sub.getsockopt(zmq.EVENTS)  # process the connection so the subscription goes out
        await asyncio.sleep(0.1)  # and reaches the PUB (slow joiner)
        h1, h2 = bytes.fromhex(HASH_INPUTS["H1_hex"]), bytes.fromhex(HASH_INPUTS["H2_hex"])
        publisher.publish([StoredEvent((h1, h2), None, tuple(range(32)), 16, (None, None))])
        publisher.publish([RemovedEvent((h2,))])
        publisher.publish([ClearedEvent()])
        stem = CAPTURES[era]
        for seq in range(3):
            assert await recv(sub) == zmq_frames(f"{stem}.pub.seq{seq}")
        await dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        for msg in range(3):
            assert await recv(dealer) == zmq_frames(f"{stem}.replay_dealer.msg{msg}")
        # A malformed request is counted and ignored; the socket keeps serving.
        await dealer.send_multipart([b"", b"\x00", b"extra"])
        await dealer.send_multipart([b"", (2).to_bytes(8, "big")])
        assert (await recv(dealer))[-1] == zmq_frames(f"{stem}.pub.seq2")[2]
        assert (await recv(dealer))[-2:] == [b"\xff" * 8, b""]
        text = publisher._metrics.render().decode()
        assert 'continuum_sim_kv_replay_requests_total{result="malformed"} 1.0' in text
    finally:
        sub.close()
        dealer.close()
        await publisher.close()


async def test_replay_buffer_keeps_only_the_last_steps(ctx: zmq.asyncio.Context) -> None:
    publisher = ZmqEventPublisher(KvEventsConfig(buffer_steps=2, era="array"), EngineMetrics("m"), ctx)
    await publisher.start()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    assert publisher.replay_endpoint
    dealer.connect(publisher.replay_endpoint)
    try:
        for _ in range(5):
            publisher.publish([ClearedEvent()])
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs = []
        while True:
            frames = await recv(dealer)
            if frames[1] == b"\xff" * 8:
                break
            seqs.append(int.from_bytes(frames[1], "big"))
        assert seqs == [3, 4], "replay silently starts at the oldest buffered batch"
    finally:
        dealer.close()
        await publisher.close()


async def replayed_seqs(dealer: zmq.asyncio.Socket) -> list[int]:
    await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    seqs = []
    while True:
        frames = await recv(dealer)  # [b"", (topic,) seq, payload]: the seq is next to last
        if frames[-2] == b"\xff" * 8:
            return seqs
        seqs.append(int.from_bytes(frames[-2], "big"))


async def test_sim_reset_empties_the_cache_and_forgets_the_event_history(ctx: zmq.asyncio.Context) -> None:
    """POST /sim/reset: as a fresh engine. A subscriber that starts afterwards replays nothing
    from before it; what is published afterwards is replayed, with sequence numbers that go on."""
    async with SimFleet(configs=[small_engine("map")], time_scale=0.001) as fleet:
        endpoint = fleet.endpoints[0]
        assert endpoint.replay_endpoint
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint.replay_endpoint)
        chat = {"messages": [{"role": "user", "content": "Policy manual. " * 30}], "max_tokens": 3}
        try:
            async with httpx.AsyncClient(base_url=endpoint.url, timeout=10) as http:
                assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
                before = await replayed_seqs(dealer)
                assert before, "the request's stores are buffered"
                assert (await http.post("/sim/reset")).status_code == 200
                assert await replayed_seqs(dealer) == []
                again = await http.post("/v1/chat/completions", json=chat)
                assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "the cache was emptied"
                after = await replayed_seqs(dealer)
                assert after and min(after) > max(before) + 1, "sequence numbers go on (the clear was one)"
        finally:
            dealer.close()


def small_engine(era: str, **kv: object) -> EngineConfig:
    base = EngineConfig(num_gpu_blocks=4096, max_model_len=4096)
    return replace(base, kv_events=replace(base.kv_events, era=era, topic="kv", **kv))  # type: ignore[arg-type]


async def collect_events(sub: zmq.asyncio.Socket, until: str) -> list[object]:
    events: list[object] = []
    while True:
        topic, seq, payload = await recv(sub)
        assert topic == b"kv" and len(seq) == 8
        batch = msgpack.unpackb(payload)
        assert len(batch) == 3 and isinstance(batch[0], float) and batch[2] == 0
        events += batch[1]
        if any((e["type"] if isinstance(e, dict) else e[0]) == until for e in batch[1]):
            return events


@pytest.mark.parametrize("era", ["map", "array", "sglang"])
async def test_request_events_carry_the_prompt_tokens_and_hashes(ctx: zmq.asyncio.Context, era: str) -> None:
    async with SimFleet(configs=[small_engine(era)], time_scale=0.001) as fleet:
        endpoint = fleet.endpoints[0]
        assert endpoint.kv_events_endpoint
        sub = subscriber(ctx, endpoint.kv_events_endpoint)
        try:
            # Keep a receive pending from the start: a ZMQ socket only processes its connection
            # (and sends its subscription) when the application calls into it.
            collector = asyncio.create_task(collect_events(sub, "AllBlocksCleared"))
            await asyncio.sleep(0.2)
            messages = [{"role": "system", "content": "Policy manual. " * 30}, {"role": "user", "content": "Hi"}]
            async with httpx.AsyncClient(base_url=endpoint.url, timeout=10) as http:
                tokens = (await http.post("/tokenize", json={"messages": messages})).json()["tokens"]
                await http.post(
                    "/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "cache_salt": "s1"}
                )
                assert (await http.post("/reset_prefix_cache")).status_code == 200
            events = await collector
        finally:
            sub.close()
    stored = [e for e in events if (e["type"] if isinstance(e, dict) else e[0]) == "BlockStored"]
    if era == "map":
        hashes = [h for e in stored for h in e["block_hashes"]]  # type: ignore[index]
        token_ids = [t for e in stored for t in e["token_ids"]]  # type: ignore[index]
        assert stored[0]["extra_keys"][0] == ["s1"] and stored[0]["parent_block_hash"] is None  # type: ignore[index]
    else:
        hashes = [h for e in stored for h in e[1]]  # type: ignore[index]
        token_ids = [t for e in stored for t in e[3]]  # type: ignore[index]
    full = len(tokens) // 16 * 16
    assert token_ids[:full] == tokens[:full], "the first blocks are exactly the templated prompt's tokens"
    if era == "sglang":
        digest, expected = None, []
        for i in range(len(token_ids) // 16):
            digest = sglang_page_digest(digest, token_ids[i * 16 : (i + 1) * 16])
            expected.append(sglang_wire_hash(digest))
        assert all(len(e[1]) == 1 for e in stored)  # type: ignore[index]
    else:
        expected = [vllm_wire_hash(d, "int") for d in chain_hashes(token_ids, 16, none_hash("0"), cache_salt="s1")]
    assert hashes == expected


async def test_connect_mode_publishes_to_a_bound_subscriber(ctx: zmq.asyncio.Context) -> None:
    port = free_port()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"tcp://127.0.0.1:{port}")
    config = small_engine("map", zmq_mode="connect", endpoint=f"tcp://127.0.0.1:{port}", replay_endpoint=None)
    try:
        async with SimFleet(configs=[config], time_scale=0.001) as fleet:
            assert fleet.endpoints[0].replay_endpoint is None
            assert fleet.listener_sources()[0]["zmq_mode"] == "bind"
            # The bound SUB sends its subscription only once it processes the new connection,
            # which happens when the application calls into it: keep a receive pending.
            collector = asyncio.create_task(collect_events(sub, "BlockStored"))
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as http:
                await http.post("/v1/completions", json={"prompt": "word " * 40, "max_tokens": 2})
            events = await collector
        assert events[0]["type"] == "BlockStored"  # type: ignore[index]
    finally:
        sub.close()
