"""Fault drills: a stack of real processes (NATS, Redis, 3 simulated vLLM engines, the KV
listener, 2 indexers, the router with the Redis response cache and KV index) under a steady
load of streamed and non-streamed requests, while one part is killed, hung or restarted.

Each drill reports what the clients lost and whether the KV index came back to exactly what
the engines hold (`ProcessStack.converged`: the index's blocks per backend against each
engine's own count of resident block hashes).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from continuum_bench.procstack import Load, LoadReport, ProcessStack
from tests.faults.conftest import Report

StackFactory = Callable[..., ProcessStack]
RATE = 20.0


async def under_load(stack: ProcessStack, before: float, fault: Callable[[], object], after: float) -> LoadReport:
    async with Load(stack.url, rate=RATE) as load:
        await asyncio.sleep(before)
        result = fault()
        if asyncio.iscoroutine(result):
            await result
        await asyncio.sleep(after)
    return load.report


async def converged(stack: ProcessStack, report: Report, name: str, within: float = 20.0) -> None:
    index, engines = await stack.converged(within)
    report(f"{name}: index blocks {index} / engine hashes {engines}")
    # on failure, what the listener and the indexers logged (epochs, replays, resyncs) says why
    logs = "".join(f"\n--- {n}\n{stack.tail(n, 15)}" for n in ("listener", *(i.name for i in stack.indexers)))
    assert engines and all(index.get(k, 0) == v for k, v in engines.items()), (index, engines, logs)


async def test_redis_killed_and_restarted(stack: ProcessStack, report: Report) -> None:

    async def outage() -> None:
        await stack.redis.kill()
        await asyncio.sleep(2)
        await stack.redis.start()

    load = await under_load(stack, 1.5, outage, 3)
    report(load.line("redis kill -9, back after 2 s"))
    metrics = await stack.router_metrics()
    assert load.lost == 0
    assert load.sent >= RATE * 6
    # The response cache fell back to memory and came back once.
    episodes = {k: v for k, v in metrics.items() if "fallback" in k and k.endswith("_total")}
    report(f"redis kill: router fallback counters {episodes}")
    await converged(stack, report, "redis kill")


async def test_nats_killed_and_restarted(stack: ProcessStack, report: Report) -> None:

    async def outage() -> None:
        await stack.nats.kill()
        await asyncio.sleep(2)
        await stack.nats.start()  # same port, same JetStream store

    load = await under_load(stack, 1.5, outage, 4)
    report(load.line("nats kill -9, back after 2 s"))
    assert load.lost == 0
    await converged(stack, report, "nats kill")


async def test_an_indexer_killed_mid_batch_while_its_replica_carries_on(stack: ProcessStack, report: Report) -> None:
    load = await under_load(stack, 1.5, stack.indexers[0].kill, 3)
    report(load.line("indexer0 kill -9 (indexer1 carries on)"))
    assert load.lost == 0
    await converged(stack, report, "indexer kill")
    await stack.indexers[0].start()
    async with Load(stack.url, rate=RATE) as more:
        await asyncio.sleep(2)
    assert more.report.lost == 0
    await converged(stack, report, "indexer restarted")


async def test_the_listener_killed_and_restarted(stack: ProcessStack, report: Report) -> None:
    assert stack.listener is not None
    listener = stack.listener

    async def restart() -> None:
        await listener.kill()
        await asyncio.sleep(2)  # engines keep publishing into the void meanwhile
        await listener.start()

    load = await under_load(stack, 1.5, restart, 3)
    report(load.line("listener kill -9, back after 2 s"))
    assert load.lost == 0
    # A new listener starts a new epoch per engine and replays the engines' buffers.
    await converged(stack, report, "listener restart")


async def test_an_engine_killed_and_restarted_with_its_sequence_reset(stack: ProcessStack, report: Report) -> None:
    engine = stack.engines[0]

    async def crash() -> None:
        await engine.kill()
        await asyncio.sleep(2)
        await engine.start()  # a new incarnation on the same ports: its seq starts again
        # The index learns of the new incarnation from its first events, so the drill goes on
        # until the router sends it traffic again (its health check takes up to a few seconds
        # on a busy machine).
        await stack.backend_healthy(stack.endpoints[0].name, within=15.0)

    load = await under_load(stack, 2, crash, 3)
    report(load.line("engine0 kill -9, back after 2 s"))
    # Only streams already flowing from the engine when it died can be lost (they end with an
    # error event); everything else is retried on another engine.
    assert set(load.failures) <= {"stream_error_event"}, load.failures
    assert load.lost <= 5
    await converged(stack, report, "engine restart")


async def test_a_hung_engine_does_not_hold_its_clients(make_stack: StackFactory, report: Report) -> None:
    async with make_stack(stream_idle_timeout_ms=2000) as stack:
        engine = stack.engines[1]

        async def hang() -> None:
            engine.signal(signal.SIGSTOP)
            await asyncio.sleep(6)
            engine.signal(signal.SIGCONT)

        load = await under_load(stack, 1.5, hang, 2)
        report(load.line("engine1 SIGSTOP for 6 s"))
        # Requests waiting for the hung engine's first byte move when the health checks take it
        # out; only streams already flowing from it end (idle timeout, an error event).
        assert set(load.failures) <= {"stream_error_event"}, load.failures
        assert load.lost <= 5
        assert load.slowest < 6.0
        await converged(stack, report, "engine hang")


async def test_a_listener_down_longer_than_the_engines_replay_buffer(make_stack: StackFactory, report: Report) -> None:
    async with make_stack(buffer_steps=5) as stack:
        assert stack.listener is not None
        listener = stack.listener

        async def long_outage() -> None:
            await listener.kill()
            await asyncio.sleep(2)  # far more than 5 engine steps
            await listener.start()

        load = await under_load(stack, 1.5, long_outage, 2)
        report(load.line("listener down 2 s, engine replay buffer 5 steps"))
        assert load.lost == 0
        index, engines = await stack.converged(within=2)
        missing = {k: v - index.get(k, 0) for k, v in engines.items()}
        report(f"replay gap: index {index}, engines {engines}, blocks the index cannot know {missing}")
        # What the engines did while nobody listened and no longer buffer is unknowable: the
        # index may miss it, but must hold nothing the engines do not (no stale blocks).
        assert all(index.get(k, 0) <= v for k, v in engines.items())
        listener_metrics = await stack.metrics(listener.health_url.replace("/healthz", "/metrics"))
        replays = {k: v for k, v in listener_metrics.items() if "replays_total" in k}
        report(f"replay gap: listener replays {replays}")
