"""The Tier 4 selector inside a real ingress (stub upstreams over loopback HTTP, a real
nats-server): approximate matching keeps a growing conversation on one backend, the cost model
spreads new conversations, several replicas share their decisions over NATS, and the prefill
queue is released after every request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest

from continuum_common.events import EventType, KvEvent
from continuum_common.hashing import request_prefix_key
from continuum_common.hashing.responses_input import responses_chat_body
from continuum_common.procs import NatsServer
from continuum_ingress.kv.chunks import chunk_chain, conversation_bytes
from continuum_ingress.protocol.apis import Api
from continuum_testing.indexer_harness import ensure_stream, publish
from continuum_testing.ingress_harness import RunningIngress, running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

SYSTEM = "You are a careful assistant. " * 40  # ~1.1 KB shared by every conversation


def kv_config(stubs: Any, nats_url: str, **kv: Any) -> dict[str, Any]:
    return {
        "backends": stub_backends(stubs),
        "selection_strategy": "RoundRobin",
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats_url, "request_timeout_ms": 500},
        "kv_cache_index": {"enabled": True, "backend": "memory", **kv},
    }


@asynccontextmanager
async def ingresses(cfg: dict[str, Any], n: int) -> AsyncIterator[list[tuple[RunningIngress, httpx.AsyncClient]]]:
    async with AsyncExitStack() as stack:
        out = []
        for _ in range(n):
            ing = await stack.enter_async_context(running_ingress(cfg))
            client = await stack.enter_async_context(httpx.AsyncClient(base_url=ing.url, timeout=10))
            assert ing.app.kv is not None
            async with asyncio.timeout(10):
                await ing.app.kv.ready.wait()
            out.append((ing, client))
        yield out


class Conversation:
    def __init__(self, name: str) -> None:
        self.messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        self.name = name
        self.turn = 0

    def next_body(self) -> dict[str, Any]:
        self.turn += 1
        # the first message is long (a pasted document), so the shared system prompt is a small
        # part of the first request: new work, placed for balance
        words = ("why? " * 60) if self.turn > 1 else (f"{self.name} pastes a document: " + "lorem ipsum " * 400)
        self.messages.append({"role": "user", "content": f"{self.name} asks question {self.turn}: " + words})
        return {"model": "m", "messages": list(self.messages)}

    def answered(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


async def send(c: httpx.AsyncClient, conv: Conversation) -> str:
    r = await c.post("/v1/chat/completions", json=conv.next_body())
    assert r.status_code == 200, r.text
    conv.answered(r.json()["choices"][0]["message"]["content"] + " " + "detail " * 40)
    return r.headers["x-continuum-backend"]


def sample(ing: RunningIngress, name: str, **labels: str) -> float:
    return ing.app.metrics.registry.get_sample_value(name, labels) or 0.0


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_growing_conversation_stays_on_one_backend(nats_server: NatsServer) -> None:
    async with running_stubs("a", "b", "c") as stubs, ingresses(kv_config(stubs, nats_server.url), 1) as [(ing, c)]:
        conv = Conversation("alice")
        first = await send(c, conv)
        # RoundRobin alone would rotate over a, b, c; the approximate records keep it where it was
        for _ in range(5):
            assert await send(c, conv) == first
        assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="kv_aware", tier="gpu_hot") == 5
        pool = ing.app.pool
        assert all(b.queued_tokens == 0 and b.in_flight == 0 for b in pool.states())


async def test_new_conversations_spread_and_each_sticks(nats_server: NatsServer) -> None:
    async with running_stubs("a", "b", "c") as stubs, ingresses(kv_config(stubs, nats_server.url), 1) as [(ing, c)]:
        convs = [Conversation(f"user{i}") for i in range(6)]
        homes = [await send(c, conv) for conv in convs]
        # every conversation shares the system prompt, but it is a small part of each first
        # request: they are placed where the least new prompt went, so they spread evenly
        assert sorted(homes.count(b) for b in "abc") == [2, 2, 2]
        placed = sum(
            sample(ing, "continuum_kv_index_routing_decisions_total", decision="placed", tier=t)
            for t in ("gpu_hot", "none")
        )
        assert placed == 6  # the first too: nothing was held anywhere, so the least busy
        assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="fallback", tier="none") == 0
        # placing the second and third away from the system prompt's only holder gives up its
        # cached head for balance, and is counted as such
        moves = sample(ing, "continuum_kv_affinity_moves_total", reason="placed")
        assert 2 <= moves <= 5
        for _ in range(3):
            for conv, home in zip(convs, homes, strict=True):
                assert await send(c, conv) == home


async def test_replicas_share_their_decisions(nats_server: NatsServer) -> None:
    async with running_stubs("a", "b", "c") as stubs, ingresses(kv_config(stubs, nats_server.url), 2) as pair:
        (ing_a, a), (ing_b, b) = pair
        conv = Conversation("bob")
        home = await send(a, conv)
        await eventually(lambda: sample(ing_b, "continuum_kv_decisions_shared_total", direction="received") >= 1)
        assert await send(b, conv) == home  # replica b learnt where replica a sent the conversation
        await eventually(lambda: sample(ing_a, "continuum_kv_decisions_shared_total", direction="received") >= 1)
        assert await send(a, conv) == home


async def test_replicas_do_not_share_when_told_not_to(nats_server: NatsServer) -> None:
    cfg_stubs = ("a", "b", "c")
    async with running_stubs(*cfg_stubs) as stubs:
        cfg = kv_config(stubs, nats_server.url, share_decisions=False)
        async with ingresses(cfg, 2) as [(ing_a, a), (ing_b, _)]:
            await send(a, Conversation("carol"))
            await asyncio.sleep(0.3)
            assert sample(ing_b, "continuum_kv_decisions_shared_total", direction="received") == 0
            assert sample(ing_a, "continuum_kv_decisions_shared_total", direction="sent") == 0


async def test_prefix_key_mode_under_the_cost_model(nats_server: NatsServer) -> None:
    """The seed's prefix-key index read by the cost model (default_mode prefix_key, scoring cost)."""
    await ensure_stream(nats_server.url)
    body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi " * 20}]}
    key = request_prefix_key(body, enabled=True)
    assert key is not None
    await publish(nats_server.url, [KvEvent("c", 1, 1, time.time(), EventType.CREATED, key.hex(), 300)])
    async with (
        running_stubs("a", "b", "c") as stubs,
        ingresses(kv_config(stubs, nats_server.url, default_mode="prefix_key"), 1) as [(ing, c)],
    ):
        embedded = ing.app.kv.embedded  # type: ignore[union-attr]
        assert embedded is not None
        await eventually(lambda: bool(embedded.index.holders_nowait(key.hex())))
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=body)
            assert r.headers["x-continuum-backend"] == "c"
        # first turns are placed as new work; what c holds of the prompt keeps them there
        assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="placed", tier="gpu_hot") == 3


async def test_placement_demand_and_start_commitments_reach_every_replica(nats_server: NatsServer) -> None:
    """A backend whose requests all hit its cache still takes requests: each one adds
    `placement_request_tokens` to its demand. A conversation's first turn also books its
    backend for the later turns conversations have been bringing (kv_cost.StartCommitments).
    Both hold here and, through the shared decision and its start flag, on the other replica;
    a backend that took nothing has neither."""
    async with running_stubs("a", "b") as stubs:
        cfg = kv_config(stubs, nats_server.url, scoring={"cost": {"placement_request_tokens": 5000}})
        async with ingresses(cfg, 2) as [(ing_a, a), (ing_b, _)]:
            conv = Conversation("dave")
            home = await send(a, conv)
            for _ in range(2):
                assert await send(a, conv) == home
            other = "b" if home == "a" else "a"
            for ing in (ing_a, ing_b):
                sel = ing.app.kv.selector  # type: ignore[union-attr]
                assert sel.commitments is not None
                # three requests: at least 3 x 5,000 on top of their new tokens; one start
                # followed by two turns of at least 5,000 each (a little decayed)
                await eventually(lambda s=sel: s.demand.value(home, s.clock()) >= 15_000)  # type: ignore[misc]
                await eventually(lambda s=sel: s.commitments.value(home, s.clock()) >= 9_000)  # type: ignore[misc]
                assert sel.demand.value(other, sel.clock()) == 0
                assert sel.commitments.value(other, sel.clock()) == 0


def answer_text(r: httpx.Response, stream: bool) -> str:
    if not stream:
        return str(r.json()["choices"][0]["message"]["content"])
    text = ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for choice in orjson.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


async def answered(client: httpx.AsyncClient, stream: bool) -> tuple[str, list[int], list[int], list[dict[str, str]]]:
    """One chat request: its backend, the 16-byte chunk chains of its messages without and with
    its answer, and the messages with the answer replayed."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is in it?"}]
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "stream": stream})
    assert r.status_code == 200, r.text
    replayed = [*messages, {"role": "assistant", "content": answer_text(r, stream)}]
    own = chunk_chain(conversation_bytes(Api.CHAT, {"messages": messages}), 16)
    chain = chunk_chain(conversation_bytes(Api.CHAT, {"messages": replayed}), 16)
    return r.headers["x-continuum-backend"], own, chain, replayed


@pytest.mark.parametrize("stream", [False, True])
async def test_the_answer_is_recorded_where_the_conversation_went(nats_server: NatsServer, stream: bool) -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = kv_config(stubs, nats_server.url, approximate={"chunk_bytes": 16})
        async with ingresses(cfg, 2) as [(ing_a, a), (ing_b, _)]:
            home, own, chain, replayed = await answered(a, stream)
            assert len(chain) > len(own) and chain[: len(own)] == own
            # both replicas hold the conversation through its answer where it went, so its next
            # turn counts only its new question as new work there
            await recorded_on_both((ing_a, ing_b), home, chain)
            # the answer is not a request: the other replica's demand is the request's alone
            sa, sb = ing_a.app.kv.selector, ing_b.app.kv.selector  # type: ignore[union-attr]
            now = sa.clock()
            assert sb.demand.value(home, now) == pytest.approx(sa.demand.value(home, now), rel=0.05)

            # an answer that is not a plain message (here: an error) records nothing
            for stub in stubs:
                stub.stub.fail_next, stub.stub.fail_status = 1, 400
            r = await a.post("/v1/chat/completions", json={"model": "m", "messages": replayed[:2], "stream": stream})
            assert r.status_code == 400
            assert sample(ing_a, "continuum_kv_approximate_answers_total", group="*", outcome="unreadable") == 1


async def recorded_on_both(replicas: tuple[RunningIngress, RunningIngress], home: str, chain: list[int]) -> None:
    """Both replicas hold `chain` on `home` (the first one learnt it from one answer)."""
    for ing in replicas:
        selector = ing.app.kv.selector  # type: ignore[union-attr]
        memory = selector.groups["*"].memory
        await eventually(lambda m=memory, s=selector: m.match(chain, [home], s.clock()) == {home: len(chain)})
    assert sample(replicas[0], "continuum_kv_approximate_answers_total", group="*", outcome="learnt") == 1


def message_text(r: httpx.Response, stream: bool) -> str:
    if not stream:
        return "\n".join(block["text"] for block in r.json()["content"])
    text = ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event = orjson.loads(line[6:])
            if event["type"] == "content_block_delta":
                text += event["delta"]["text"]
    return text


@pytest.mark.parametrize("stream", [False, True])
async def test_an_anthropic_answer_is_recorded_where_the_conversation_went(
    nats_server: NatsServer, stream: bool
) -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = kv_config(stubs, nats_server.url, approximate={"chunk_bytes": 16})
        async with ingresses(cfg, 2) as [(ing_a, a), (ing_b, _)]:
            body = {"model": "m", "system": SYSTEM, "max_tokens": 40, "stream": stream,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "What is in it?"}]}]}  # fmt: skip
            r = await a.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
            assert r.status_code == 200, r.text
            home = r.headers["x-continuum-backend"]
            answer = message_text(r, stream)
            assert answer
            replayed = {"role": "assistant", "content": [{"type": "text", "text": answer}]}
            next_turn = {**body, "messages": [*body["messages"], replayed, {"role": "user", "content": "Why?"}]}
            own = chunk_chain(conversation_bytes(Api.MESSAGES, body), 16)
            chain = chunk_chain(conversation_bytes(Api.MESSAGES, next_turn), 16)[: len(own) + 1]
            assert len(chain) > len(own)
            await recorded_on_both((ing_a, ing_b), home, chain)


async def test_with_answer_learning_off_no_answer_is_read(nats_server: NatsServer) -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = kv_config(stubs, nats_server.url, approximate={"chunk_bytes": 16}, learn_answers=False)
        async with ingresses(cfg, 1) as [(ing, client)]:
            home, own, chain, _ = await answered(client, True)
            selector = ing.app.kv.selector  # type: ignore[union-attr]
            memory = selector.groups["*"].memory
            await eventually(lambda: memory.match(own, [home], selector.clock()) == {home: len(own)})
            await asyncio.sleep(0.2)
            assert memory.match(chain, [home], selector.clock()) == {home: len(own)}, "the answer was not recorded"
            for outcome in ("learnt", "unreadable"):
                assert not sample(ing, "continuum_kv_approximate_answers_total", group="*", outcome=outcome)


async def test_a_responses_answer_is_recorded_where_the_conversation_went(nats_server: NatsServer) -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = kv_config(stubs, nats_server.url, approximate={"chunk_bytes": 16})
        async with ingresses(cfg, 2) as [(ing_a, a), (ing_b, _)]:
            body = {"model": "m", "instructions": SYSTEM, "input": [{"role": "user", "content": "What is in it?"}]}
            r = await a.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
            home = r.headers["x-continuum-backend"]
            # the next turn resends the output item as the client got it
            next_turn = {**body, "input": [*body["input"], *r.json()["output"], {"role": "user", "content": "Why?"}]}
            own = chunk_chain(conversation_bytes(Api.CHAT, responses_chat_body(body)), 16)
            chain = chunk_chain(conversation_bytes(Api.CHAT, responses_chat_body(next_turn)), 16)[: len(own) + 1]
            assert len(chain) > len(own)
            await recorded_on_both((ing_a, ing_b), home, chain)
