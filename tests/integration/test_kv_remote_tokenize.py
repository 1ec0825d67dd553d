"""Precise matching without a local tokenizer, inside a real ingress in front of real simulated
engines over loopback HTTP: the engines' /tokenize gives the token ids, and what it answered is
remembered by conversation prefix so a new turn, or a request sharing its first messages, is
matched without a call on its path (docs/kv-scorer.md, "Matching modes")."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import nats
import orjson
import pytest

from continuum_common.hashing.blocks import make_block_hasher
from continuum_common.procs import NatsServer
from continuum_common.wire.decisions import Tokenized, encode_tokenized
from continuum_ingress.kv.known_prefixes import conversation_digests
from continuum_sim import EngineConfig, SimFleet
from continuum_testing.ingress_harness import RunningIngress, running_ingress

SYSTEM = {"role": "system", "content": "You answer questions about the attached quarterly report. " * 80}


def config(fleet: SimFleet, nats_url: str, **group: Any) -> dict[str, Any]:
    e = fleet.endpoints[0]
    # These tests follow requests that ask /tokenize on their path when nothing close is known
    # (`on_path`); test_kv_new_prompts_off_path covers the default, `off_path`. They follow
    # what /tokenize is asked off the path too: test_kv_answer_ids covers the default, the ids
    # returned with the answers.
    spec = {
        "name": "fleet",
        "models": [e.model],
        "mode": "precise",
        "engine": "vllm",
        "tokenize_new_prompts": "on_path",
        "token_ids_from_answers": False,
    }
    spec.update(block_size=e.block_size, hash_seed=e.python_hash_seed, **group)
    backends = [
        {"name": f"e{i}", "url": ep.url, "type": "vllm", "models": [ep.model], "health_check_interval_ms": 100}
        for i, ep in enumerate(fleet.endpoints)
    ]
    return {
        "backends": backends,
        "selection_strategy": "RoundRobin",
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats_url, "request_timeout_ms": 500},
        # Two engines and a handful of requests: conversation starts stay with their system
        # prompt's holder however busy it is, and a request's demand is mostly its prompt's
        # new tokens (not the default 3,000 per request, which at three requests would move a
        # prompt holding a quarter of itself), so where a request lands shows what it matched.
        "kv_cache_index": {
            "enabled": True,
            "backend": "memory",
            "groups": [spec],
            "scoring": {"cost": {"placement_tolerance": 10.0, "placement_request_tokens": 256}},
        },
    }


@asynccontextmanager
async def stack(
    nats_url: str, time_scale: float = 0.001, *, engine: EngineConfig | None = None, **group: Any
) -> AsyncIterator[tuple[SimFleet, RunningIngress, httpx.AsyncClient]]:
    """Two engines (`engine`: their configuration) and one ingress; `group` overrides the
    match group's settings."""
    async with (
        SimFleet(2, config=engine, time_scale=time_scale) as fleet,
        running_ingress(config(fleet, nats_url, **group)) as ing,
    ):
        assert ing.app.kv is not None
        async with asyncio.timeout(10):
            await ing.app.kv.ready.wait()
        async with httpx.AsyncClient(base_url=ing.url, timeout=10) as client:
            yield fleet, ing, client


def how(ing: RunningIngress, label: str) -> float:
    sample = ing.app.metrics.registry.get_sample_value
    return sample("continuum_kv_remote_tokenize_total", {"group": "fleet", "how": label}) or 0.0


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


async def ask(client: httpx.AsyncClient, model: str, messages: list[dict[str, str]]) -> str:
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r.headers["x-continuum-backend"]


async def engine_chain(fleet: SimFleet, messages: list[dict[str, str]], generation: bool) -> list[int]:
    """The block hashes the engine computes for `messages`, from its own /tokenize."""
    e = fleet.endpoints[0]
    async with httpx.AsyncClient(timeout=10) as c:
        body = {"model": e.model, "messages": messages, "add_generation_prompt": generation}
        tokens = (await c.post(f"{e.url}/tokenize", json=body)).json()["tokens"]
    hasher = make_block_hasher("vllm", e.block_size, hash_seed=e.python_hash_seed)
    return [hasher.wire(d) for d in hasher.chain(tokens)]


async def assert_learnt(ing: RunningIngress, fleet: SimFleet, messages: list[dict[str, str]]) -> None:
    """What the ingress remembers for `messages` (without a generation prompt) is the engine's
    own block hashes."""
    model = fleet.endpoints[0].model
    known = ing.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
    assert known is not None
    digests, _ = conversation_digests({"model": model}, model, messages)
    found = known.find(digests)
    assert found is not None
    assert found[1].chain.tolist() == await engine_chain(fleet, messages, generation=False)


async def test_siblings_and_next_turns_are_matched_without_a_call_on_their_path(nats_server: NatsServer) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        first = [SYSTEM, {"role": "user", "content": "What was the revenue?"}]
        home = await ask(client, model, first)
        assert how(ing, "request") == 1
        # off the path: the request without its last message (what siblings share) and, once
        # answered, the request with its answer (what its next turn starts with)
        await eventually(lambda: how(ing, "background") == 2)
        assert how(ing, "answer") == 1
        await assert_learnt(ing, fleet, [SYSTEM])
        known = ing.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
        assert known is not None

        # a sibling (same system prompt, another question): no call on its path, same engine
        # (RoundRobin would have sent it to the other one), its answer learnt off the path
        sibling = [SYSTEM, {"role": "user", "content": "And the costs?"}]
        assert await ask(client, model, sibling) == home
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 1
        await eventually(lambda: how(ing, "background") == 3)

        # the sibling's next turn with an answer other than the one it received: it still
        # finds the sibling's own messages (the start of what was learnt), no call
        turn2 = [*sibling, {"role": "assistant", "content": "Lower."}, {"role": "user", "content": "Why?"}]
        assert await ask(client, model, turn2) == home
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 2
        await eventually(lambda: how(ing, "background") == 4)
        own, _ = conversation_digests({"model": model}, model, sibling)
        derived = known.find(own)
        assert derived is not None and derived[0] == 2
        engine = await engine_chain(fleet, sibling, generation=True)
        assert 2 <= len(derived[1].chain) < len(engine)
        assert derived[1].chain.tolist() == engine[: len(derived[1].chain)]

        # an exact repeat: the remembered answer is the request's whole chain
        assert await ask(client, model, first) == home
        assert how(ing, "known") == 1 and how(ing, "request") == 1

        # nothing close is known (a different system prompt): asked on the path again
        other = [{"role": "system", "content": "Another assistant. " * 40}, {"role": "user", "content": "Hi"}]
        await ask(client, model, other)
        assert how(ing, "request") == 2
        await eventually(lambda: how(ing, "background") == 6)
        assert how(ing, "background_failed") == 0 and how(ing, "background_skipped") == 0

        # a known prefix under 512 tokens is not used: asked on the path
        short = {"role": "system", "content": "Be brief and answer in one short sentence. " * 20}
        await ask(client, model, [short, {"role": "user", "content": "One?"}])
        await eventually(lambda: how(ing, "background") == 8)
        await ask(client, model, [short, {"role": "user", "content": "Two?"}])
        assert how(ing, "request") == 4
        assert how(ing, "no_answer") == 0


async def answer_of(response: httpx.Response, stream: bool) -> tuple[str, int]:
    """The assistant text of a chat completion and the prompt tokens the engine had cached."""
    if not stream:
        doc = response.json()
        return doc["choices"][0]["message"]["content"], doc["usage"]["prompt_tokens_details"]["cached_tokens"]
    text, cached = "", -1
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            chunk = orjson.loads(line[6:])
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return text, cached


@pytest.mark.parametrize("stream", [False, True])
async def test_a_next_turn_replaying_its_answer_is_matched_through_it(nats_server: NatsServer, stream: bool) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}

        async def chat(messages: list[dict[str, str]]) -> tuple[str, str, int]:
            body = {"model": model, "messages": messages, "max_tokens": 40, **extra}
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            text, cached = await answer_of(r, stream)
            return r.headers["x-continuum-backend"], text, cached

        first = [SYSTEM, {"role": "user", "content": "What was the revenue?"}]
        home, answer, _ = await chat(first)
        assert answer
        await eventually(lambda: how(ing, "answer") == 1 and how(ing, "background") == 2)
        replayed = [*first, {"role": "assistant", "content": answer}]
        known = ing.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
        digests, _ = conversation_digests({"model": model}, model, replayed)
        found = known.find(digests)
        assert found is not None and found[0] == 3
        learnt = found[1].chain.tolist()
        assert learnt == await engine_chain(fleet, replayed, generation=False)

        # the next turn: matched through the answer (all but the last learnt block), no call on
        # its path, and the engine really had all of that cached
        went, _, cached = await chat([*replayed, {"role": "user", "content": "And why?"}])
        assert went == home
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 1
        block_size = fleet.endpoints[0].block_size
        assert cached >= (len(learnt) - 1) * block_size
        assert how(ing, "no_answer") == 0


def message_of(response: httpx.Response, stream: bool) -> tuple[str, int]:
    """The text of an Anthropic Messages response and the prompt tokens the engine had cached."""
    if not stream:
        doc = response.json()
        return "\n".join(b["text"] for b in doc["content"]), doc["usage"]["cache_read_input_tokens"]
    text, cached = "", -1
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            event = orjson.loads(line[6:])
            if event["type"] == "content_block_delta":
                text += event["delta"]["text"]
            elif event["type"] == "message_start":
                cached = event["message"]["usage"]["cache_read_input_tokens"]
    return text, cached


@pytest.mark.parametrize("stream", [False, True])
async def test_an_anthropic_next_turn_replaying_its_answer_is_matched_through_it(
    nats_server: NatsServer, stream: bool
) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model

        async def send(system: str, messages: list[dict[str, Any]]) -> tuple[str, str, int]:
            body = {"model": model, "system": system, "messages": messages, "max_tokens": 40, "stream": stream}
            r = await client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
            assert r.status_code == 200, r.text
            text, cached = message_of(r, stream)
            return r.headers["x-continuum-backend"], text, cached

        first = [{"role": "user", "content": [{"type": "text", "text": "What was the revenue?"}]}]
        home, answer, _ = await send(SYSTEM["content"], first)
        assert answer
        await eventually(lambda: how(ing, "answer") == 1 and how(ing, "background") == 2)
        # as the client replays it: a content array with the one text block it got
        replayed = [*first, {"role": "assistant", "content": [{"type": "text", "text": answer}]}]
        as_chat = [
            SYSTEM,
            {"role": "user", "content": "What was the revenue?"},
            {"role": "assistant", "content": answer},
        ]
        known = ing.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
        found = known.find(conversation_digests({"model": model}, model, as_chat)[0])
        assert found is not None and found[0] == 3
        learnt = found[1].chain.tolist()
        assert learnt == await engine_chain(fleet, as_chat, generation=False)

        went, _, cached = await send(SYSTEM["content"], [*replayed, {"role": "user", "content": "And why?"}])
        assert went == home
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 1
        assert cached >= (len(learnt) - 1) * fleet.endpoints[0].block_size, "the engine held it all"
        assert how(ing, "no_answer") == 0


def response_of(response: httpx.Response, stream: bool) -> tuple[dict[str, Any], int]:
    """The final response object of a Responses answer and the prompt tokens the engine had cached."""
    if not stream:
        doc = response.json()
    else:
        lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
        ends = ("response.completed", "response.incomplete")  # incomplete: cut at max_output_tokens
        doc = next(e["response"] for e in map(orjson.loads, lines) if e["type"] in ends)
    return doc, doc["usage"]["input_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_responses_next_turn_replaying_its_output_is_matched_through_it(
    nats_server: NatsServer, stream: bool
) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model

        async def send(items: list[dict[str, Any]]) -> tuple[str, dict[str, Any], int]:
            body = {"model": model, "instructions": SYSTEM["content"], "input": items, "store": False,
                    "max_output_tokens": 40, "stream": stream}  # fmt: skip
            r = await client.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
            doc, cached = response_of(r, stream)
            return r.headers["x-continuum-backend"], doc, cached

        first: list[dict[str, Any]] = [{"role": "user", "content": "What was the revenue?"}]
        home, doc, _ = await send(first)
        await eventually(lambda: how(ing, "answer") == 1 and how(ing, "background") == 2)
        text = "\n".join(p["text"] for item in doc["output"] for p in item["content"])
        as_chat = [SYSTEM, first[0], {"role": "assistant", "content": text}]
        known = ing.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
        found = known.find(conversation_digests({"model": model}, model, as_chat)[0])
        assert found is not None and found[0] == 3
        learnt = found[1].chain.tolist()
        assert learnt == await engine_chain(fleet, as_chat, generation=False)

        # the next turn resends the output items as the client got them
        went, _, cached = await send([*first, *doc["output"], {"role": "user", "content": "And why?"}])
        assert went == home
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 1
        assert cached >= (len(learnt) - 1) * fleet.endpoints[0].block_size, "the engine held it all"
        assert how(ing, "no_answer") == 0


async def test_with_answer_learning_off_the_request_itself_is_learnt(nats_server: NatsServer) -> None:
    async with SimFleet(2, time_scale=0.001) as fleet:
        cfg = config(fleet, nats_server.url)
        cfg["kv_cache_index"]["learn_answers"] = False
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10) as client:
            assert ing.app.kv is not None
            async with asyncio.timeout(10):
                await ing.app.kv.ready.wait()
            model = fleet.endpoints[0].model
            await ask(client, model, [SYSTEM, {"role": "user", "content": "What was the revenue?"}])
            await eventually(lambda: how(ing, "background") == 1)  # the system prompt
            sibling = [SYSTEM, {"role": "user", "content": "And the costs?"}]
            await ask(client, model, sibling)
            await eventually(lambda: how(ing, "background") == 2)  # the sibling's own messages
            assert how(ing, "answer") == 0 and how(ing, "no_answer") == 0
            known = ing.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
            found = known.find(conversation_digests({"model": model}, model, sibling)[0])
            assert found is not None and found[0] == 2


async def test_without_a_readable_answer_the_request_itself_is_learnt(nats_server: NatsServer) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        await ask(client, model, [SYSTEM, {"role": "user", "content": "What was the revenue?"}])
        await eventually(lambda: how(ing, "background") == 2)
        # the engine refuses the sibling after it was routed: nothing to replay, so the
        # sibling's own messages are learnt once it has ended
        sibling = [SYSTEM, {"role": "user", "content": "And the costs?"}]
        body = {"model": model, "messages": sibling, "max_tokens": 4, "n": 2}
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        assert how(ing, "known_prefix") == 1
        await eventually(lambda: how(ing, "no_answer") == 1 and how(ing, "background") == 3)
        known = ing.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
        digests, _ = conversation_digests({"model": model}, model, sibling)
        found = known.find(digests)
        assert found is not None and found[0] == 2
        assert found[1].chain.tolist() == await engine_chain(fleet, sibling, generation=True)


async def test_a_next_turn_is_learnt_once_the_request_has_been_answered(nats_server: NatsServer) -> None:
    # Engines in real time: a 100-token answer streams for about 0.6 s.
    async with stack(nats_server.url, time_scale=1.0) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        await ask(client, model, [SYSTEM, {"role": "user", "content": "What was the revenue?"}])
        await eventually(lambda: how(ing, "background") == 2)  # the system prompt, and the answer
        sibling = [SYSTEM, {"role": "user", "content": "And the costs?"}]
        body = {"model": model, "messages": sibling, "max_tokens": 100, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            chunks = r.aiter_bytes()
            await anext(chunks)
            assert how(ing, "known_prefix") == 1
            # while the answer streams, the engine is not asked about the sibling's messages
            await asyncio.sleep(0.2)
            assert how(ing, "background") == 2
            async for _ in chunks:
                pass
        await eventually(lambda: how(ing, "background") == 3)
        assert how(ing, "answer") == 2
        assert how(ing, "background_failed") == 0 and how(ing, "background_skipped") == 0


async def test_with_the_memory_off_every_request_asks_on_its_path(nats_server: NatsServer) -> None:
    async with stack(nats_server.url, tokenize_memory_blocks=0) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        for question in ("One?", "Two?", "One?"):
            await ask(client, model, [SYSTEM, {"role": "user", "content": question}])
        assert how(ing, "request") == 3
        assert how(ing, "known") == how(ing, "known_prefix") == how(ing, "background") == 0


async def complete(client: httpx.AsyncClient, model: str, prompt: str) -> str:
    r = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r.headers["x-continuum-backend"]


async def test_a_completion_prompt_extending_a_known_one_is_matched_without_a_call(nats_server: NatsServer) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        turn1 = "The quarterly report covers revenue, costs and the outlook for next year. " * 80
        home = await complete(client, model, turn1)
        assert how(ing, "request") == 1
        # the next turn replays the conversation as text and adds to it: no call on its path,
        # same engine (RoundRobin would have sent it to the other), learnt off the path
        turn2 = turn1 + "Answer: revenue grew. Question: and the costs? "
        assert await complete(client, model, turn2) == home
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 1
        await eventually(lambda: how(ing, "background") == 1)
        remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
        assert remote.texts is not None and len(remote.texts) == 2
        assert await complete(client, model, turn2) == home
        assert how(ing, "known") == 1

        # what the memory matched is the engine's own chain, up to a margin short of turn 1
        e = fleet.endpoints[0]
        async with httpx.AsyncClient(timeout=10) as c:
            tokens = (await c.post(f"{e.url}/tokenize", json={"model": model, "prompt": turn2})).json()["tokens"]
        hasher = make_block_hasher("vllm", e.block_size, hash_seed=e.python_hash_seed)
        engine = [hasher.wire(d) for d in hasher.chain(tokens)]
        learnt = remote.texts.find(remote_text_key(model, turn2))
        assert learnt is not None and learnt[0].chain.tolist() == engine

        # a known prompt followed by three times as much new text: matched by what is known
        # (the new text is held nowhere yet), no call on its path, same engine
        fork = turn1 + "A different question about the appendix and its tables. " * 300
        assert await complete(client, model, fork) == home
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 2

        # a prompt sharing less than 512 tokens with anything known: asked on the path
        await complete(client, model, turn1[:1500] + "Something else entirely. " * 60)
        assert how(ing, "request") == 2
        await eventually(lambda: how(ing, "background") == 2)
        assert how(ing, "background_failed") == 0


async def test_the_smallest_known_part_used_is_configurable(nats_server: NatsServer) -> None:
    async with stack(nats_server.url, tokenize_memory_min_tokens=64) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        turn1 = "The quarterly report covers revenue, costs and the outlook for next year. " * 80
        home = await complete(client, model, turn1)
        # about 300 known tokens, most of the prompt: under the default 512 this asks on its path
        short = turn1[:1600] + "Something else entirely. " * 20
        went = await complete(client, model, short)
        assert how(ing, "request") == 1 and how(ing, "known_prefix") == 1
        assert went == home
        await eventually(lambda: how(ing, "background") == 1)


def remote_text_key(model: str, prompt: str) -> bytes:
    """What RemoteTokens keys a completion prompt by (the context digest, then the text)."""
    return hashlib.blake2b(orjson.dumps([model, None]), digest_size=16).digest() + prompt.encode()


async def assert_text_learnt(ing: RunningIngress, fleet: SimFleet, prompt: str) -> None:
    """What the ingress remembers for the completion prompt covers the engine's own full
    blocks of it."""
    remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
    assert remote.texts is not None
    e = fleet.endpoints[0]
    learnt = remote.texts.find(remote_text_key(e.model, prompt))
    async with httpx.AsyncClient(timeout=10) as c:
        tokens = (await c.post(f"{e.url}/tokenize", json={"model": e.model, "prompt": prompt})).json()["tokens"]
    assert learnt is not None and len(learnt[0].chain) == len(tokens) // e.block_size


async def test_token_id_prompts_are_matched_by_their_own_ids_without_any_call(nats_server: NatsServer) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        shared = [(i * 7919) % 30000 + 100 for i in range(1500)]  # a long shared head of token ids

        async def ids(prompt: list[int]) -> str:
            r = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4})
            assert r.status_code == 200, r.text
            return r.headers["x-continuum-backend"]

        home = await ids([*shared, 1, 2, 3])
        # RoundRobin alone alternates between the two engines; the KV selector keeps each
        # request that shares the head where the head is
        for tail in ([4, 5], [6, 7, 8, 9], [10], [11, 12]):
            assert await ids([*shared, *tail]) == home
        kinds = ("request", "known", "known_prefix", "background")
        assert all(how(ing, kind) == 0 for kind in kinds)  # no /tokenize call at all
        sample = ing.app.metrics.registry.get_sample_value
        fallbacks = sample("continuum_kv_precise_fallbacks_total", {"group": "fleet", "reason": "tokenize_failed"})
        assert not fallbacks


@asynccontextmanager
async def two_replicas(
    nats_url: str, **section: Any
) -> AsyncIterator[tuple[SimFleet, list[RunningIngress], list[httpx.AsyncClient]]]:
    """Two ingress replicas on one NATS in front of the same two engines."""
    async with SimFleet(2, time_scale=0.001) as fleet:
        cfg = config(fleet, nats_url)
        cfg["kv_cache_index"].update(section)
        async with running_ingress(cfg) as a, running_ingress(cfg) as b:
            for ing in (a, b):
                assert ing.app.kv is not None
                async with asyncio.timeout(10):
                    await ing.app.kv.ready.wait()
                await eventually(lambda ing=ing: ing.app.kv.decisions is not None)  # type: ignore[union-attr,misc]
            async with (
                httpx.AsyncClient(base_url=a.url, timeout=10) as ca,
                httpx.AsyncClient(base_url=b.url, timeout=10) as cb,
            ):
                yield fleet, [a, b], [ca, cb]


async def test_a_tokenization_one_replica_asked_for_serves_the_other_without_a_call(nats_server: NatsServer) -> None:
    async with two_replicas(nats_server.url) as (fleet, (a, b), (ca, cb)):
        model = fleet.endpoints[0].model
        # replica A asks /tokenize on the path, and learns the system prompt and the request
        # with its answer off it; all three reach replica B over NATS
        first = [SYSTEM, {"role": "user", "content": "What was the revenue?"}]
        home = await ask(ca, model, first)
        assert how(a, "request") == 1
        await eventually(lambda: how(b, "shared") == 3)
        # B never asked, yet matches the next turn and a sibling from what A learnt, and sends
        # them where A sent the conversation (RoundRobin would alternate)
        turn2 = [*first, {"role": "assistant", "content": "It grew."}, {"role": "user", "content": "Why?"}]
        assert await ask(cb, model, turn2) == home
        sibling = [SYSTEM, {"role": "user", "content": "And the costs?"}]
        assert await ask(cb, model, sibling) == home
        assert how(b, "request") == 0 and how(b, "known_prefix") == 2
        remembered = b.app.kv.selector.remote["fleet"].known  # type: ignore[union-attr]
        assert remembered is not None
        digests, _ = conversation_digests({"model": model}, model, [SYSTEM])
        found = remembered.find(digests)
        assert found is not None
        assert found[1].chain.tolist() == await engine_chain(fleet, [SYSTEM], generation=False)

        # completion prompts too: A asks for turn 1, B matches turn 2 extending it
        text1 = "The quarterly report covers revenue, costs and the outlook for next year. " * 80
        text_home = await complete(ca, model, text1)
        await eventually(lambda: how(b, "shared") == 4)
        assert await complete(cb, model, text1 + "Answer: it grew. Question: why? ") == text_home
        assert how(b, "request") == 0 and how(b, "known_prefix") == 3

        # an undecodable message and one for a group B does not have: counted or ignored, and
        # B keeps serving
        nc = await nats.connect(nats_server.url)
        try:
            # (in this order: once the second is counted, the first was handled)
            stranger = Tokenized("intruder", "no-such-group", 0, b"d" * 16, [1, 2], 32, 100)
            await nc.publish("continuum.kv.tokenized.intruder", encode_tokenized(stranger))
            await nc.publish("continuum.kv.tokenized.intruder", b"\x93not-a-tokenization")
            await nc.flush()
        finally:
            await nc.close()
        dropped = b.app.metrics.registry.get_sample_value
        await eventually(lambda: (dropped("continuum_kv_decisions_dropped_total", {"reason": "decode"}) or 0) == 1)
        assert how(b, "shared") == 4
        assert await ask(cb, model, turn2) == home


async def test_with_decision_sharing_off_each_replica_asks_for_itself(nats_server: NatsServer) -> None:
    async with two_replicas(nats_server.url, share_decisions=False) as (fleet, (a, b), (ca, cb)):
        model = fleet.endpoints[0].model
        await ask(ca, model, [SYSTEM, {"role": "user", "content": "What was the revenue?"}])
        await eventually(lambda: how(a, "background") >= 1)
        await ask(cb, model, [SYSTEM, {"role": "user", "content": "And the costs?"}])
        assert how(b, "request") == 1 and how(b, "shared") == 0 and how(a, "shared") == 0
