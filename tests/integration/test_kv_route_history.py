"""The route history (docs/kv-scorer.md, "After a restart"): what ingress replicas share over
NATS is also kept in the JetStream stream CONTINUUM_KV_ROUTES, and an ingress that starts after
another stopped replays it. Real nats-server, real ingress processes' apps, real simulated
engines over loopback HTTP."""

from __future__ import annotations

import argparse
import asyncio
import time
from array import array
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import nats
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from continuum_common.config.kv_index import RouteHistory
from continuum_common.procs import NatsServer, free_port
from continuum_common.wire.decisions import HISTORY_STREAM, KIND_APPROXIMATE, Decision
from continuum_ingress.kv.adapters.route_history import ensure_history_stream
from continuum_ingress.kv.known_prefixes import Known
from continuum_sim import SimFleet
from continuum_testing.ingress_harness import RunningIngress, running_ingress
from tests.integration.test_kv_remote_tokenize import SYSTEM, ask, config, eventually, how

FIRST = [SYSTEM, {"role": "user", "content": "What was the revenue?"}]
TURN2 = [*FIRST, {"role": "assistant", "content": "It grew."}, {"role": "user", "content": "Why?"}]


def sample(ing: RunningIngress, name: str, labels: dict[str, str]) -> float:
    return ing.app.metrics.registry.get_sample_value(name, labels) or 0.0


def replays(ing: RunningIngress, result: str) -> float:
    return sample(ing, "continuum_kv_route_history_replays_total", {"result": result})


def restored(ing: RunningIngress, kind: str) -> float:
    return sample(ing, "continuum_kv_route_history_restored_total", {"kind": kind})


@asynccontextmanager
async def replica(cfg: dict[str, Any]) -> AsyncIterator[tuple[RunningIngress, httpx.AsyncClient]]:
    async with running_ingress(cfg) as ing:
        kv = ing.app.kv
        assert kv is not None
        async with asyncio.timeout(10):
            await kv.ready.wait()
        await eventually(lambda: kv.decisions is not None)
        async with httpx.AsyncClient(base_url=ing.url, timeout=10) as client:
            yield ing, client


async def stored_messages(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(HISTORY_STREAM)).state.messages)
    finally:
        await nc.close()


async def test_a_restarted_ingress_remembers_what_its_predecessor_learnt(nats_server: NatsServer) -> None:
    async with SimFleet(2, time_scale=0.001) as fleet:
        cfg = config(fleet, nats_server.url)
        model = fleet.endpoints[0].model
        async with replica(cfg) as (a, ca):
            await eventually(lambda: replays(a, "done") == 1)  # the stream was empty: nothing to restore
            assert restored(a, "decision") == restored(a, "tokenization") == 0
            home = await ask(ca, model, FIRST)
            assert how(a, "request") == 1
            # A stops at once; off the path it is still learning the system prompt and the
            # request with its answer: it finishes that and shares it before it lets NATS go
        assert how(a, "background") == 2
        # its decision and its three tokenizations are in the stream
        assert await stored_messages(nats_server.url) == 4
        async with replica(cfg) as (b, cb):
            await eventually(lambda: replays(b, "done") == 1)
            assert restored(b, "decision") == 1 and restored(b, "tokenization") == 3
            assert how(b, "restored") == 3 and how(b, "shared") == 0
            # before B routed anything: A's request counts as recent demand where it went
            assert b.app.kv is not None
            selector = b.app.kv.selector
            now = selector.clock()
            assert selector.demand.value(home, now) > 0
            assert selector.demand.value("e1" if home == "e0" else "e0", now) == 0
            # the next turn and a sibling are matched with what A learnt: no call on the path
            assert await ask(cb, model, TURN2) == home
            assert await ask(cb, model, [SYSTEM, {"role": "user", "content": "And the costs?"}]) == home
            assert how(b, "request") == 0 and how(b, "known_prefix") == 2


async def test_without_the_history_a_restarted_ingress_asks_again(nats_server: NatsServer) -> None:
    async with SimFleet(2, time_scale=0.001) as fleet:
        cfg = config(fleet, nats_server.url)
        cfg["kv_cache_index"]["route_history"] = {"enabled": False}
        model = fleet.endpoints[0].model
        async with replica(cfg) as (a, ca):
            await ask(ca, model, FIRST)
            await eventually(lambda: how(a, "background") == 2)
        async with replica(cfg) as (b, cb):
            await ask(cb, model, TURN2)
            assert how(b, "request") == 1 and how(b, "restored") == 0
            assert replays(b, "done") == 0 and replays(b, "failed") == 0
    nc = await nats.connect(nats_server.url)
    try:
        try:
            await nc.jetstream().stream_info(HISTORY_STREAM)
            raise AssertionError("the stream was created with the history off")
        except NotFoundError:
            pass
    finally:
        await nc.close()


async def test_approximate_records_survive_a_restart(nats_server: NatsServer) -> None:
    async with SimFleet(2, time_scale=0.001) as fleet:
        cfg = config(fleet, nats_server.url, mode="approximate")
        model = fleet.endpoints[0].model
        conversations = [
            [{"role": "system", "content": f"Conversation {i}: " + "details of the case. " * 200}] for i in range(4)
        ]
        homes = []
        async with replica(cfg) as (a, ca):
            await eventually(lambda: replays(a, "done") == 1)
            for messages in conversations:
                homes.append(await ask(ca, model, [*messages, {"role": "user", "content": "First question?"}]))
        assert len(set(homes)) == 2  # both engines hold some of them
        async with replica(cfg) as (b, cb):
            await eventually(lambda: replays(b, "done") == 1)
            assert restored(b, "decision") >= 4
            # before B routed anything, it holds A's records of each conversation where it went
            assert b.app.kv is not None
            memory = b.app.kv.selector.groups["fleet"].approximate_memory
            assert {e: memory.entries(e) > 0 for e in set(homes)} == {e: True for e in set(homes)}
            for messages, home in zip(conversations, homes, strict=True):
                turn = [*messages, {"role": "user", "content": "First question?"}]
                turn += [{"role": "assistant", "content": "An answer."}, {"role": "user", "content": "More?"}]
                assert await ask(cb, model, turn) == home


async def test_a_stream_that_cannot_be_created_leaves_live_sharing_working(nats_server: NatsServer) -> None:
    # an operator's stream already claims the decision subjects: ours cannot be created
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name="OPERATORS", subjects=["continuum.kv.decisions.*"]))
    finally:
        await nc.close()
    async with SimFleet(2, time_scale=0.001) as fleet:
        cfg = config(fleet, nats_server.url)
        model = fleet.endpoints[0].model
        async with replica(cfg) as (a, ca), replica(cfg) as (b, cb):
            await eventually(lambda: replays(a, "failed") == 1 and replays(b, "failed") == 1)
            home = await ask(ca, model, FIRST)
            await eventually(lambda: how(b, "shared") == 3)
            assert await ask(cb, model, TURN2) == home
            assert how(b, "request") == 0


async def test_processes_starting_together_create_the_stream_once(nats_server: NatsServer) -> None:
    # the workers of one `serve` (or replicas) start at the same moment; a stream an operator
    # already made with other limits is kept as it is
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        settings = [RouteHistory(max_age=age) for age in (60.0, 120.0, 180.0)]
        created = await asyncio.gather(*(ensure_history_stream(js, s, 1) for s in settings))
        assert sorted(created) == [False, False, True]
        assert (await js.stream_info(HISTORY_STREAM)).config.subjects == [
            "continuum.kv.decisions.*",
            "continuum.kv.tokenized.*",
        ]
    finally:
        await nc.close()


async def test_a_stopping_ingress_hands_over_what_it_is_still_learning(nats_server: NatsServer) -> None:
    async with SimFleet(2, time_scale=0.001) as fleet:
        async with replica(config(fleet, nats_server.url)) as (a, _):
            kv = a.app.kv
            assert kv is not None and kv.decisions is not None
            await eventually(lambda: replays(a, "done") == 1)
            remote = kv.selector.remote["fleet"]

            async def learning() -> None:  # an off-path /tokenize that answers half a second later
                await asyncio.sleep(0.5)
                remote._remember_chat(b"d" * 16, Known(array("Q", [1, 2, 3]), 48, 100))

            lesson = asyncio.get_running_loop().create_task(learning())
            remote._tasks.add(lesson)
            lesson.add_done_callback(remote._tasks.discard)
            for i in range(2000):  # and a queue of decisions not yet published
                kv.decisions.offer(Decision(kv.replica, "fleet", "e0", KIND_APPROXIMATE, time.time(), [i + 1], 1))
        assert lesson.done() and not lesson.cancelled()
    assert await stored_messages(nats_server.url) == 2001


async def test_ready_only_once_the_history_is_replayed(nats_server: NatsServer) -> None:
    from continuum_bench.route_history import fill  # a history shaped like a fleet's, 2,000 messages

    history = {"conversations": 200, "turns": 5, "chunks_per_turn": 20, "blocks_per_turn": 75}
    count, _ = await fill(nats_server.url, argparse.Namespace(**history, spread=60.0, seed=3))
    async with (
        SimFleet(2, time_scale=0.001) as fleet,
        running_ingress(config(fleet, nats_server.url)) as ing,
        httpx.AsyncClient(base_url=ing.url, timeout=10) as client,
    ):
        async with asyncio.timeout(20):
            while (await client.get("/readyz")).status_code != 200:
                await asyncio.sleep(0.005)
        assert replays(ing, "done") == 1
        assert restored(ing, "decision") + restored(ing, "tokenization") == count


async def test_ready_after_the_timeout_when_nats_is_down(nats_server: NatsServer) -> None:
    async with SimFleet(2, time_scale=0.001) as fleet:
        cfg = config(fleet, f"nats://127.0.0.1:{free_port()}")  # nothing listens there
        cfg["kv_cache_index"]["ready_timeout"] = "1s"
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10) as client:
            first = await client.get("/readyz")
            assert first.status_code == 503 and first.json()["ready"] is False
            await asyncio.sleep(1.1)
            assert (await client.get("/readyz")).status_code == 200
            # and it routes all the same, without the KV state
            assert await ask(client, fleet.endpoints[0].model, FIRST) in {"e0", "e1"}
