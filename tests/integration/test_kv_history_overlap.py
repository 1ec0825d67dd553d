"""Another replica keeps publishing while an ingress starts and replays the route history: every
decision is applied exactly once, whether it came live, from the replay, or both (the moment
between the live subscription and the replay's read of where the stream ends). Real nats-server
with JetStream, the ingress's DecisionShare."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import nats

from continuum_common.config.kv_index import RouteHistory
from continuum_common.procs import NatsServer
from continuum_common.wire.decisions import KIND_APPROXIMATE, Decision, Tokenized, encode_decision, subject_for
from continuum_ingress.kv.adapters.decisions import DecisionShare
from continuum_ingress.kv.adapters.route_history import ensure_history_stream

STARTS = 6


async def test_decisions_published_while_a_replica_starts_are_applied_once(fresh_nats_server: NatsServer) -> None:
    history = RouteHistory()
    publisher = await nats.connect(fresh_nats_server.url)
    published = 0
    stop = asyncio.Event()

    async def publish() -> None:
        # another replica, as fast as it can (a few thousand decisions a second), one at a time
        nonlocal published
        while not stop.is_set():
            d = Decision("r-other", "*", "b", KIND_APPROXIMATE, time.time(), [published], 10, False)
            await publisher.publish(subject_for("r-other"), encode_decision(d))
            await publisher.flush()
            published += 1

    try:
        await ensure_history_stream(publisher.jetstream(), history, 1)
        publishing = asyncio.create_task(publish())
        shares: list[tuple[DecisionShare, Counter[int], asyncio.Task[None]]] = []
        for i in range(STARTS):  # replicas starting one after the other into the traffic
            await asyncio.sleep(0.05)
            seen: Counter[int] = Counter()
            replayed: list[str] = []

            def handed(message: Decision | Tokenized, seen: Counter[int] = seen) -> None:
                assert isinstance(message, Decision)
                seen[message.keys[0]] += 1

            nc = await nats.connect(fresh_nats_server.url)
            share = DecisionShare(
                nc, f"r{i}", handed, history=history, on_restored=handed,
                on_replayed=lambda result, n, replayed=replayed: replayed.append(result),
            )  # fmt: skip
            shares.append((share, seen, asyncio.create_task(share.run())))
            async with asyncio.timeout(10):
                while not replayed:
                    await asyncio.sleep(0.01)
            assert replayed == ["done"]
        await asyncio.sleep(0.05)
        stop.set()
        await publishing
        for share, seen, task in shares:
            async with asyncio.timeout(10):  # the last ones arrive live
                while len(seen) < published:
                    await asyncio.sleep(0.01)
            assert sorted(seen) == list(range(published))  # nothing lost...
            assert max(seen.values()) == 1  # ...and nothing applied twice
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await share.nc.close()
        print("published", published, "copies skipped", [s.overlap.skipped for s, _, _ in shares])
    finally:
        await publisher.close()
