"""vLLM / SGLang sources over real ZMQ sockets: fixtures through PUB → SUB, replay through a
real ROUTER, publisher restarts, malformed frames, and the bind-mode publisher allow-list."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio

from continuum_common.config.listener import ListenerSource
from continuum_common.events import EventType, KvEvent
from continuum_common.hashing import MESSAGE_TAG, prefix_key_from_text
from continuum_common.procs import free_port
from continuum_common.salt import make_salt
from continuum_listener.adapters.detokenize import DetokenizeClient
from continuum_listener.adapters.zap import ZapHandler
from continuum_listener.adapters.zmq_source import ZAP_DOMAIN_PREFIX, Readiness, ZmqSource
from continuum_listener.attribution import Resolver
from continuum_listener.metrics import ListenerMetrics
from continuum_listener.pipeline import PipelineSettings, SourcePipeline
from continuum_listener.policy.chains import Limits, State
from continuum_testing.engines import DetokenizeServer, EnginePublisher, batch, removed, stored

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv-events"
HASHES = json.loads((FIXTURES / "manifest.json").read_text())["hash_inputs"]["vllm"]
H1, H2, H3 = HASHES["H1_u64"], HASHES["H2_u64"], HASHES["H3_u64"]
U64 = 1 << 64
S1, S2, S3 = 2806306361972916095, 847842904238558909, 7560581105281291331
P1, P2, P3 = -8414988064021443811 + U64, 2559240691446296867, -1435765121642336996 + U64
MODEL = "Qwen/Qwen3-8B"
SECRET = b"zmq-test-secret"
QWEN = {151644: "<|im_start|>", 872: "user", 198: "\n", 9064: "Where", 374: " is", 279: " the", 6722: " capital",
        315: " of", 5616: " France", 30: "?", 151645: "<|im_end|>", 77091: "assistant", 151667: "<think>"}  # fmt: skip
QUESTION = "Where is the capital of France?"
KEY = prefix_key_from_text(MODEL, QUESTION, tag=MESSAGE_TAG, max_prefix_length=1024)
LORA_KEY = prefix_key_from_text("adapter-a", QUESTION, tag=MESSAGE_TAG, max_prefix_length=1024)


def qwen_decode(tokens: list[int]) -> str:
    return "".join(QWEN.get(t, f"<{t}>") for t in tokens)


class Collect:
    def __init__(self) -> None:
        self.events: list[KvEvent] = []

    def submit(self, event: KvEvent) -> None:
        self.events.append(event)

    def take(self) -> list[tuple[str, str, int, bytes | None]]:
        out = [
            (e.type.value, e.tier.value, e.token_count, bytes.fromhex(e.prefix_hash) if e.prefix_hash else None)
            for e in self.events
        ]
        self.events.clear()
        return out


@dataclass
class Rig:
    engine: EnginePublisher
    pipeline: SourcePipeline
    source: ZmqSource
    sink: Collect

    async def send(self, payload: bytes) -> None:
        await self.engine.send(payload)

    async def settle(self, batches: int | None = None) -> None:
        """Wait until the listener applied `batches` batches in total and has no detokenize work."""
        for _ in range(500):
            applied = self.pipeline.metrics.sample("continuum_kv_listener_batches_total", {"backend": "b"})
            busy = self.pipeline.jobs_waiting or any(t.pending_jobs for t in self.pipeline.trackers.values())
            if (batches is None or applied >= batches) and not busy:
                await asyncio.sleep(0.01)
                if not (self.pipeline.jobs_waiting or any(t.pending_jobs for t in self.pipeline.trackers.values())):
                    return
            await asyncio.sleep(0.01)
        raise AssertionError("listener did not settle")

    def chains(self) -> dict[int, int]:
        tracker = self.pipeline.tracker(0)
        return {h: b.depth for h, b in tracker.blocks.items() if b.state is not State.DEAD}


@contextlib.asynccontextmanager
async def rig(
    *,
    mode: str = "detokenize",
    replay: bool = True,
    shape: str = "new",
    detokenize_url: str | None = None,
    bind: bool = False,
    allowed: list[str] | None = None,
    replay_timeout_ms: int = 2000,
) -> AsyncIterator[Rig]:
    ctx = zmq.asyncio.Context()
    port, replay_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    source_cfg = ListenerSource(
        backend_name="b",
        engine="vllm",
        publish="prefix",
        model=MODEL,
        zmq_endpoint=endpoint,
        zmq_mode="bind" if bind else "connect",
        topic="kv-events",
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if replay else None,
        prefix_key_mode=mode,  # type: ignore[arg-type]
        detokenize_endpoint=detokenize_url,
        chat_template="chatml",
        allowed_publishers=allowed or [],
        request_timeout_ms=replay_timeout_ms,
    )
    metrics = ListenerMetrics(["b"])
    sink = Collect()
    client = None
    resolver = None
    if detokenize_url is not None:
        client = DetokenizeClient(detokenize_url, model=MODEL, timeout=2.0)
        resolver = Resolver(detokenize=client, family="chatml", model=MODEL, max_prefix_length=1024)
    settings = PipelineSettings(Limits(), 0.0, 1024, SECRET)
    pipeline = SourcePipeline(source_cfg, settings, metrics, [sink], resolver)
    pipeline.start_epoch("start")
    sink.events.clear()
    tasks = [asyncio.create_task(pipeline.run())]
    zap = None
    if bind:
        zap = ZapHandler(
            ctx, {ZAP_DOMAIN_PREFIX + "b": frozenset(allowed or [])}, lambda d: metrics.denied.labels("b").inc()
        )
        tasks.append(asyncio.create_task(zap.run()))
    source = ZmqSource(ctx, source_cfg, pipeline)
    tasks.append(asyncio.create_task(source.run()))
    engine = EnginePublisher(
        ctx, endpoint, replay_endpoint=f"tcp://127.0.0.1:{replay_port}" if replay else None, bind=not bind,
        shape=shape,  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        yield Rig(engine, pipeline, source, sink)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await engine.close()
        if client is not None:
            await client.aclose()
        ctx.destroy(linger=0)


@pytest.fixture
async def detok() -> AsyncIterator[DetokenizeServer]:
    server = DetokenizeServer(qwen_decode)
    async with server:
        yield server


def fixture(path: str) -> bytes:
    return (FIXTURES / path).read_bytes()


VLLM_DIRS = sorted(p.name for p in (FIXTURES / "vllm").iterdir())


@pytest.mark.parametrize("version", VLLM_DIRS)
async def test_vllm_fixtures_through_a_real_pub_socket(version: str, detok: DetokenizeServer) -> None:
    async with rig(detokenize_url=f"{detok.url}/detokenize") as r:
        await r.engine.wait_subscribed()
        files = sorted((FIXTURES / "vllm" / version).glob("*.msgpack"))
        sent = 0

        async def run(name: str) -> list[tuple[str, str, int, bytes | None]]:
            nonlocal sent
            await r.send(fixture(f"vllm/{version}/{name}"))
            sent += 1
            await r.settle(sent)
            return r.sink.take()

        for path in files:
            await run("batch_cleared.msgpack")
            name = path.name
            variant = name.removeprefix("batch_").removesuffix(".msgpack")
            if variant.startswith("removed"):
                stored_name = name.replace("removed", "stored")
                await run(stored_name if (path.parent / stored_name).exists() else "batch_stored.msgpack")
                assert r.chains() == {H1: 16, H2: 32, H3: 48}
                assert await run(name) == [("updated", "gpu_hot", 32, KEY)], name
                assert r.chains() == {H1: 16, H2: 32}
            elif variant.startswith("stored") and variant != "stored_extra_keys":
                assert await run(name) == [("created", "gpu_hot", 48, KEY)], name
                assert r.chains() == {H1: 16, H2: 32, H3: 48}
                assert r.pipeline.tracker(0).chain(H3) == [H1, H2, H3]
            elif variant == "stored_extra_keys":
                assert await run(name) == [("created", "gpu_hot", 32, LORA_KEY)]
                assert len(r.chains()) == 2
            elif variant == "cleared":
                assert await run(name) == [("cleared", "gpu_hot", 0, None)]
                assert r.chains() == {}
            elif variant == "mixed":
                # stored + removed + cleared in one batch: the reset wins, the detokenize answer
                # for the (now gone) chain is ignored.
                assert await run(name) == [("cleared", "gpu_hot", 0, None)]
                assert r.chains() == {}
            elif variant == "offload_tiers_example":
                assert await run(name) == [("offloaded", "storage_warm", 32, KEY)]
                assert r.chains() == {H1: 16, H2: 32}
                counts = r.pipeline.metrics.sample
                assert (
                    counts("continuum_kv_listener_chain_events_total", {"backend": "b", "what": "placeholder_unknown"})
                    == 1
                )
            else:
                raise AssertionError(f"unexpected fixture {name}")
        assert r.pipeline.stats.dropped == 0


async def test_sglang_fixtures_through_a_real_pub_socket(detok: DetokenizeServer) -> None:
    async with rig(detokenize_url=f"{detok.url}/detokenize") as r:
        await r.engine.wait_subscribed()
        base = "sglang/sglang-20260723-bd3f6a7/"
        sent = 0

        async def run(name: str) -> list[tuple[str, str, int, bytes | None]]:
            nonlocal sent
            await r.send(fixture(base + name))
            sent += 1
            await r.settle(sent)
            return r.sink.take()

        assert await run("batch_stored_page16.msgpack") == [("created", "gpu_hot", 48, KEY)]
        assert r.pipeline.tracker(0).chain(S3) == [S1, S2, S3]
        assert await run("batch_removed_page16.msgpack") == [("evicted", "gpu_hot", 0, KEY)]
        assert await run("batch_stored_host_cpu_pinned.msgpack") == [("offloaded", "storage_warm", 16, KEY)]
        assert await run("batch_cleared.msgpack") == [("cleared", "gpu_hot", 0, None)]
        # Page size 1: "<|im_start|>user\n" does not determine the anchor yet; tracked, unattributed.
        assert await run("batch_stored_page1.msgpack") == []
        assert r.chains() == {P1: 1, P2: 2, P3: 3}
        assert [r.pipeline.tracker(0).blocks[h].state for h in (P1, P2, P3)] == [State.OPEN] * 3
        assert await run("batch_mixed_page16.msgpack") == [("cleared", "gpu_hot", 0, None)]
        assert detok.calls > 0


async def test_salt_echo_through_zmq_needs_no_detokenize() -> None:
    async with rig(mode="salt_echo") as r:
        await r.engine.wait_subscribed()
        salt = make_salt(SECRET, "b", KEY)
        forged = make_salt(b"other", "b", KEY)
        await r.send(batch([stored([1, 2], None, [7] * 32, 16, salt=salt), stored([3], 2, [8] * 16, 16)]))
        await r.send(batch([stored([10], None, [7] * 16, 16, salt=forged), stored([11], None, [7] * 16, 16)]))
        await r.settle(2)
        assert r.sink.take() == [("created", "gpu_hot", 48, KEY)]
        assert r.chains() == {1: 16, 2: 32, 3: 48}
        sample = r.pipeline.metrics.sample
        assert sample("continuum_kv_listener_chain_events_total", {"backend": "b", "what": "salt_invalid"}) == 1
        assert sample("continuum_kv_listener_chain_events_total", {"backend": "b", "what": "salt_missing"}) == 1


@pytest.mark.parametrize("shape", ["old", "new"])
async def test_replay_recovers_a_forced_gap(shape: str) -> None:
    async with rig(mode="salt_echo", shape=shape) as r:
        await r.engine.wait_subscribed()
        salt = make_salt(SECRET, "b", KEY)
        await r.send(batch([stored([1], None, [1] * 16, 16, salt=salt)]))  # seq 0
        r.engine.skip(batch([stored([2], 1, [2] * 16, 16)]))  # seq 1: lost in transit
        r.engine.skip(batch([stored([3], 2, [3] * 16, 16)]))  # seq 2: lost in transit
        await r.send(batch([removed([1])]))  # seq 3 reveals the gap
        await r.settle(4)
        # from the last batch applied (seq 0), which the replay compares with what was applied
        assert r.engine.replay_requests == [0]
        assert r.chains() == {2: 32, 3: 48}
        assert r.pipeline.source.backend_name == "b" and r.source.seq.last == 3
        events = r.sink.take()
        # window 0: one flush per batch, replayed batches included, in seq order
        assert events == [
            ("created", "gpu_hot", 16, KEY),
            ("updated", "gpu_hot", 32, KEY),
            ("updated", "gpu_hot", 48, KEY),
        ]
        assert (
            r.pipeline.metrics.sample("continuum_kv_listener_replays_total", {"backend": "b", "outcome": "recovered"})
            == 1
        )
        assert r.pipeline.stats.dropped == 0


async def test_a_quiet_engine_is_replayed_at_start_up() -> None:
    async with rig(mode="salt_echo") as r:
        salt = make_salt(SECRET, "b", KEY)
        # The engine published before the listener subscribed, then went quiet: without a live
        # batch to reveal it, the listener still rebuilds what the engine holds.
        r.engine.skip(batch([stored([1], None, [1] * 16, 16, salt=salt)]))
        r.engine.skip(batch([stored([2], 1, [2] * 16, 16)]))
        await r.engine.wait_subscribed()
        await r.settle(2)
        assert r.engine.replay_requests == [0]
        assert r.chains() == {1: 16, 2: 32}
        assert r.source.seq.last == 1
        # the next live batch follows on, nothing replayed twice
        await r.send(batch([stored([3], 2, [3] * 16, 16)]))
        await r.settle(3)
        assert r.engine.replay_requests == [0]
        assert r.chains() == {1: 16, 2: 32, 3: 48}


async def test_join_replays_history_and_restart_resets_state() -> None:
    async with rig(mode="salt_echo") as r:
        salt = make_salt(SECRET, "b", KEY)
        # The engine published before the listener subscribed: seq 0 and 1 are only in its buffer.
        r.engine.skip(batch([stored([1], None, [1] * 16, 16, salt=salt)]))
        r.engine.skip(batch([stored([2], 1, [2] * 16, 16)]))
        await r.engine.wait_subscribed()
        await r.send(batch([stored([3], 2, [3] * 16, 16)]))  # seq 2
        await r.settle(3)
        assert r.engine.replay_requests == [0]
        assert r.chains() == {1: 16, 2: 32, 3: 48}
        epoch = r.pipeline.sequencer.epoch
        assert [e[2] for e in r.sink.take()] == [16, 32, 48]
        # Engine restart: seq back to 0, empty cache.
        r.engine.restart()
        await r.send(batch([stored([9], None, [1] * 16, 16, salt=salt)]))
        await r.settle(4)
        assert r.chains() == {9: 16}
        assert r.pipeline.sequencer.epoch > epoch
        events = r.sink.events[:]
        assert [e.type for e in events] == [EventType.CLEARED, EventType.CREATED]
        assert [e.seq for e in events] == [1, 2] and events[0].source_epoch == r.pipeline.sequencer.epoch
        assert (
            r.pipeline.metrics.sample(
                "continuum_kv_listener_epochs_total", {"backend": "b", "reason": "publisher_restart"}
            )
            == 1
        )


async def test_gap_beyond_the_replay_buffer_starts_a_new_epoch() -> None:
    async with rig(mode="salt_echo") as r:
        await r.engine.wait_subscribed()
        salt = make_salt(SECRET, "b", KEY)
        await r.send(batch([stored([1], None, [1] * 16, 16, salt=salt)]))  # seq 0
        await r.settle(1)
        epoch = r.pipeline.sequencer.epoch
        r.engine.skip(batch([removed([1])]))  # seq 1: lost, and then evicted from the buffer
        r.engine.skip(batch([stored([5], None, [1] * 16, 16, salt=salt)]))  # seq 2
        r.engine.buffer.popleft()
        r.engine.buffer.popleft()
        await r.send(batch([stored([6], 5, [1] * 16, 16)]))  # seq 3
        await r.settle(3)
        assert r.pipeline.sequencer.epoch > epoch
        assert r.chains() == {5: 16, 6: 32}  # block 1 is not trusted any more
        assert (
            r.pipeline.metrics.sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": "replay_lost"})
            == 1
        )


async def test_gap_without_replay_endpoint_or_answer_resyncs() -> None:
    async with rig(mode="salt_echo", replay=False) as r:
        await r.engine.wait_subscribed()
        salt = make_salt(SECRET, "b", KEY)
        await r.send(batch([stored([1], None, [1] * 16, 16, salt=salt)]))
        r.engine.skip(b"lost")
        await r.send(batch([stored([2], None, [1] * 16, 16, salt=salt)]))
        await r.settle(2)
        assert r.chains() == {2: 16}
        assert r.pipeline.metrics.sample("continuum_kv_listener_epochs_total", {"backend": "b", "reason": "gap"}) == 1


async def test_malformed_input_is_counted_and_the_source_keeps_running() -> None:
    async with rig(mode="salt_echo", replay=False) as r:
        await r.engine.wait_subscribed()
        salt = make_salt(SECRET, "b", KEY)
        topic = b"kv-events"
        bad_frames = [
            [topic, (0).to_bytes(8, "big")],  # 2 frames
            [topic, (0).to_bytes(8, "big"), b"x", b"y"],  # 4 frames
            [topic, b"\x00\x01", b"payload"],  # short seq
        ]
        for frames in bad_frames:
            await r.engine.send(b"", frames=frames)
        payloads = [
            msgpack.packb([1.0, [["BlockStored", [1]]]])[:-4],  # truncated
            b"\xc1garbage",
            msgpack.packb([1.0, [["BlockStored", list(range(200_000)), None, [], 1]]]),  # huge hash list
            msgpack.packb([1.0, [["BlockStored", [1], None, "tokens", 16]], 0]),  # wrong types
            msgpack.packb({"not": "a batch"}),
            msgpack.packb([1.0, [["Teleported"]], 0]),
        ]
        for payload in payloads:
            await r.send(payload)
        await r.send(batch([stored([1], None, [1] * 16, 16, salt=salt)]))
        await r.settle(3)  # 3 well-framed batches reach the decoder's batch counter
        assert r.chains() == {1: 16}
        assert r.sink.take() == [("created", "gpu_hot", 16, KEY)]
        sample = r.pipeline.metrics.sample

        def dropped(reason: str) -> float:
            return sample("continuum_kv_event_dropped_total", {"backend": "b", "reason": reason})

        assert dropped("frames") == 3
        assert dropped("msgpack") == 2
        assert dropped("too_large") == 1
        assert dropped("schema") == 2
        assert dropped("unknown_tag") == 1
        assert r.source.seq.last == len(payloads)  # malformed payloads still advance the seq


async def test_bind_mode_accepts_only_allowed_publishers() -> None:
    async with rig(mode="salt_echo", replay=False, bind=True, allowed=["127.0.0.1"]) as r:
        await r.engine.wait_subscribed()
        await r.send(batch([stored([1], None, [1] * 16, 16, salt=make_salt(SECRET, "b", KEY))]))
        await r.settle(1)
        assert r.chains() == {1: 16}
    async with rig(mode="salt_echo", replay=False, bind=True, allowed=["10.255.255.1"]) as r:
        for _ in range(50):
            if r.pipeline.metrics.sample("continuum_kv_listener_publishers_denied_total", {"backend": "b"}) >= 1:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the publisher was not refused")
        await r.send(batch([stored([1], None, [1] * 16, 16, salt=make_salt(SECRET, "b", KEY))]))
        await asyncio.sleep(0.2)
        assert r.chains() == {} and not r.pipeline.stats.connected


async def test_readiness_wakes_for_queued_messages_and_times_out_without() -> None:
    """The SUB socket's FD as the source awaits it: a message queued before the wait is seen at
    once, one that arrives during the wait wakes it, and a quiet socket times out."""
    ctx = zmq.asyncio.Context()
    port = free_port()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    sub: zmq.Socket[bytes] = zmq.Socket(ctx, zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    ready = Readiness(sub)
    try:
        for _ in range(200):  # until the subscription has reached the publisher
            await pub.send(b"hello")
            if await ready.wait(0.02):
                break
        else:
            pytest.fail("the subscription never connected")
        while True:  # drain the probes
            try:
                sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await ready.wait(0.2) is False  # nothing queued
        assert loop.time() - started >= 0.15
        await pub.send(b"queued-before")
        await asyncio.sleep(0.05)  # its signal comes and goes while nobody waits
        assert await ready.wait(1.0) is True
        assert sub.recv(zmq.NOBLOCK) == b"queued-before"
        waiter = asyncio.create_task(ready.wait(5.0))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await pub.send(b"during")
        assert await asyncio.wait_for(waiter, 2.0) is True
        assert sub.recv(zmq.NOBLOCK) == b"during"
    finally:
        ready.close()
        sub.close(linger=0)
        pub.close(linger=0)
        ctx.term()
