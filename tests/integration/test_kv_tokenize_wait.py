"""`tokenize_wait_ms` in a real ingress in front of real simulated engines over loopback HTTP:
a request that must ask `/tokenize` on its path waits at most that long; past it the request
is routed at once with approximate keys and the call finishes off its path, its answer
remembered and recorded as held where the request went (docs/kv-scorer.md, "New prompts")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from continuum_common.procs import NatsServer
from continuum_ingress.kv.known_prefixes import conversation_digests
from continuum_sim import EngineConfig, SimFleet
from continuum_sim.policy.timing import TimingConfig
from continuum_testing.ingress_harness import RunningIngress
from tests.integration.test_kv_remote_tokenize import SYSTEM, ask, engine_chain, eventually, how, stack

QUESTION = [SYSTEM, {"role": "user", "content": "What was the revenue?"}]


@asynccontextmanager
async def slow_tokenize_stack(
    nats_url: str, tokenize_s: float, **group: Any
) -> AsyncIterator[tuple[SimFleet, RunningIngress, httpx.AsyncClient]]:
    """Two engines whose `/tokenize` answers after `tokenize_s` real seconds."""
    engine = EngineConfig(timing=TimingConfig(tokenize_s=tokenize_s))
    async with stack(nats_url, 1.0, engine=engine, **group) as s:
        yield s


async def test_a_late_tokenize_answer_does_not_hold_the_request(nats_server: NatsServer) -> None:
    slow = slow_tokenize_stack(nats_server.url, 3.0, tokenize_wait_ms=20, tokenize_timeout_ms=8000)
    async with slow as (fleet, ing, client):
        model = fleet.endpoints[0].model
        home = await ask(client, model, QUESTION)
        # answered while its /tokenize call was still running (the engine takes 3 s to answer it)
        assert how(ing, "late") == 1 and how(ing, "request") == 0
        assert how(ing, "late_answered") == 0

        # the call finishes off the path: remembered, and recorded as held where the request went
        await eventually(lambda: how(ing, "late_answered") == 1)
        remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
        assert remote.known is not None
        digests, _ = conversation_digests({"model": model}, model, QUESTION)
        found = remote.known.find(digests)
        chain = await engine_chain(fleet, QUESTION, generation=True)
        assert found is not None and found[0] == len(QUESTION)
        assert found[1].chain.tolist() == chain
        group = ing.app.kv.selector.groups["fleet"]  # type: ignore[union-attr]
        names = [f"e{i}" for i in range(len(fleet.endpoints))]
        assert group.memory.match(chain, names, remote.clock()) == {home: len(chain)}

        # the same request again is matched from memory: no call, same engine
        assert await ask(client, model, QUESTION) == home
        assert how(ing, "known") == 1 and how(ing, "late") == 1 and how(ing, "request") == 0


async def test_an_answer_within_the_wait_is_used_on_the_path(nats_server: NatsServer) -> None:
    # text the engine's tokenizer cuts into many short tokens (2 bytes each, not the usual 4)
    dense = [{"role": "system", "content": "a b c d e f g h " * 80}, {"role": "user", "content": "Why?"}]
    async with slow_tokenize_stack(nats_server.url, 0.0, tokenize_wait_ms=5000) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        await ask(client, model, dense)
        assert how(ing, "request") == 1 and how(ing, "late") == 0
        remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
        assert remote.known is not None
        digests, _ = conversation_digests({"model": model}, model, dense)
        found = remote.known.find(digests)
        assert found is not None and found[1].chain.tolist() == await engine_chain(fleet, dense, generation=True)
        # the answer also measured the engine's bytes per token: requests matched approximately
        # are estimated with it from now on, not with the configured 4
        group = ing.app.kv.selector.groups["fleet"]  # type: ignore[union-attr]
        assert group.bytes_per_token == pytest.approx(found[1].nbytes / found[1].tokens, rel=0.15)
        assert group.bytes_per_token < 3.0


async def test_a_late_call_that_fails_is_counted_and_the_request_served(nats_server: NatsServer) -> None:
    failing = slow_tokenize_stack(nats_server.url, 2.0, tokenize_wait_ms=20, tokenize_timeout_ms=300)
    async with failing as (fleet, ing, client):
        model = fleet.endpoints[0].model
        completion = {"model": model, "prompt": "A one-off prompt about the weather. " * 60, "max_tokens": 4}
        r = await client.post("/v1/completions", json=completion)
        assert r.status_code == 200, r.text
        assert how(ing, "late") == 1
        # the call gives up at its timeout, off the path: counted, nothing remembered
        await eventually(lambda: how(ing, "late_failed") == 1)
        assert how(ing, "late_answered") == 0
        remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
        assert remote.texts is not None and len(remote.texts) == 0
        # the ingress keeps serving
        assert await ask(client, model, QUESTION) in {"e0", "e1"}


async def test_late_calls_are_bounded(nats_server: NatsServer) -> None:
    """Past `max_late` calls finishing off the path, a request that outlasts its wait cancels
    its call (`late_dropped`) and is served the same."""
    stalled = slow_tokenize_stack(nats_server.url, 2.0, tokenize_wait_ms=20, tokenize_timeout_ms=1500)
    async with stalled as (fleet, ing, client):
        model = fleet.endpoints[0].model
        remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
        remote.max_late = 2
        prompts = [{"model": model, "prompt": f"One-off prompt {i} about the weather. " * 60} for i in range(5)]
        replies = await asyncio.gather(*(client.post("/v1/completions", json={**p, "max_tokens": 4}) for p in prompts))
        assert [r.status_code for r in replies] == [200] * 5
        assert how(ing, "late") == 5 and how(ing, "late_dropped") == 3
        assert len(remote._late) <= 2
        # the two kept run to their timeout (the engine answers after 2 s), off the path
        await eventually(lambda: how(ing, "late_failed") == 2)
        assert how(ing, "late_answered") == 0 and not remote._late
