"""Token ids returned with the answers (`token_ids_from_answers`, for vLLM groups)
in a real ingress in front of real simulated engines over loopback HTTP: the ingress asks the
engine for them (vLLM's `return_token_ids`), learns from them instead of calling /tokenize
once a request has been answered, and the client receives its answer without them
(docs/kv-scorer.md, "Token ids from the answer")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest

from continuum_common.procs import NatsServer
from continuum_ingress.kv.known_prefixes import conversation_digests
from continuum_ingress.kv.remote_tokens import MAX_MISSING
from continuum_sim import EngineConfig, SimFleet
from continuum_testing.ingress_harness import RunningIngress
from tests.integration.test_kv_remote_tokenize import (
    SYSTEM,
    answer_of,
    assert_learnt,
    assert_text_learnt,
    engine_chain,
    eventually,
    how,
    remote_text_key,
)
from tests.integration.test_kv_remote_tokenize import stack as remote_stack


@asynccontextmanager
async def stack(
    nats_url: str, *, engine: EngineConfig | None = None
) -> AsyncIterator[tuple[SimFleet, RunningIngress, httpx.AsyncClient]]:
    """Two engines and one ingress with a precise group at its defaults (new prompts off the
    path, ids from the answers)."""
    async with remote_stack(nats_url, engine=engine, tokenize_new_prompts="off_path", token_ids_from_answers=True) as s:
        yield s


def without_ids(response: httpx.Response, stream: bool) -> None:
    """The client's answer carries no token ids, and is whole, valid JSON."""
    assert b"token_ids" not in response.content
    if not stream:
        response.json()
        return
    lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        orjson.loads(line[6:])


@pytest.mark.parametrize("stream", [False, True])
async def test_conversation_turns_are_learnt_from_the_answers_ids_without_tokenize(
    nats_server: NatsServer, stream: bool
) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}

        async def chat(messages: list[dict[str, str]]) -> tuple[str, str, int]:
            body = {"model": model, "messages": messages, "max_tokens": 40, **extra}
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            without_ids(r, stream)
            text, cached = await answer_of(r, stream)
            return r.headers["x-continuum-backend"], text, cached

        first = [SYSTEM, {"role": "user", "content": "What was the revenue?"}]
        home, answer, _ = await chat(first)
        assert answer
        # the request's own prompt and the conversation with its answer, from the answer's
        # ids; only the shared part (what siblings start with) asks /tokenize
        await eventually(lambda: how(ing, "answer_ids") == 2)
        await eventually(lambda: how(ing, "background") == 1)
        assert how(ing, "answer_ids_missing") == 0 and how(ing, "new") == 1
        await assert_learnt(ing, fleet, [SYSTEM])
        remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
        assert remote.known is not None
        digests, _ = conversation_digests({"model": model}, model, first)
        own = remote.known.find(digests)
        assert own is not None and own[0] == 2
        assert own[1].chain.tolist() == await engine_chain(fleet, first, generation=True)
        replayed = [*first, {"role": "assistant", "content": answer}]
        digests, _ = conversation_digests({"model": model}, model, replayed)
        found = remote.known.find(digests)
        assert found is not None and found[0] == 3
        learnt = found[1].chain.tolist()
        # what the engine holds: the prompt and the answer it generated, as its next turn
        # renders them
        assert learnt == (await engine_chain(fleet, replayed, generation=False))[: len(learnt)]

        # the next turn: matched through the answer, no call on its path, same engine, and
        # the engine really had that cached
        went, _, cached = await chat([*replayed, {"role": "user", "content": "And why?"}])
        assert went == home
        assert how(ing, "known_prefix") == 1 and how(ing, "request") == 0
        assert cached >= (len(learnt) - 1) * fleet.endpoints[0].block_size
        await eventually(lambda: how(ing, "answer_ids") == 4)
        assert how(ing, "background") == 1 and how(ing, "background_failed") == 0


async def test_a_client_asking_for_the_ids_gets_them(nats_server: NatsServer) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        body = {"model": model, "messages": [SYSTEM, {"role": "user", "content": "Hi"}], "max_tokens": 5}
        r = await client.post("/v1/chat/completions", json={**body, "return_token_ids": True})
        assert r.status_code == 200, r.text
        doc = r.json()
        assert len(doc["choices"][0]["token_ids"]) == 5
        assert (
            doc["prompt_token_ids"]
            == (
                await httpx.AsyncClient(timeout=10).post(
                    f"{fleet.endpoints[0].url}/tokenize", json={"model": model, "messages": body["messages"]}
                )
            ).json()["tokens"]
        )
        await eventually(lambda: how(ing, "answer_ids") == 2)
        # asked false: the ingress still asks for them, and cuts them out of the answer
        r = await client.post("/v1/chat/completions", json={**body, "return_token_ids": False, "stream": True})
        assert r.status_code == 200
        without_ids(r, True)


async def test_a_completion_prompt_is_learnt_from_its_answers_ids(nats_server: NatsServer) -> None:
    async with stack(nats_server.url) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        turn1 = "The quarterly report covers revenue, costs and the outlook for next year. " * 80
        r = await client.post("/v1/completions", json={"model": model, "prompt": turn1, "max_tokens": 4})
        assert r.status_code == 200, r.text
        without_ids(r, False)
        home = r.headers["x-continuum-backend"]
        await eventually(lambda: how(ing, "answer_ids") == 1)
        await assert_text_learnt(ing, fleet, turn1)

        # the next turn extends it (streamed): matched by what was learnt, no call at all
        turn2 = turn1 + "Answer: revenue grew. Question: and the costs? "
        body = {"model": model, "prompt": turn2, "max_tokens": 4, "stream": True}
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.headers["x-continuum-backend"] == home
        without_ids(r, True)
        assert how(ing, "known_prefix") == 1
        await eventually(lambda: how(ing, "answer_ids") == 2)
        assert how(ing, "background") == 0 and how(ing, "request") == 0


async def test_an_engine_that_returns_no_ids_is_asked_no_more_and_tokenize_is_used(nats_server: NatsServer) -> None:
    async with stack(nats_server.url, engine=EngineConfig(return_token_ids=False)) as (fleet, ing, client):
        model = fleet.endpoints[0].model
        remote = ing.app.kv.selector.remote["fleet"]  # type: ignore[union-attr]
        served: dict[str, int] = {}
        for i in range(12):
            prompt = f"Document {i}: " + "the figures of the quarter in detail. " * 60
            r = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4})
            assert r.status_code == 200, r.text
            backend = r.headers["x-continuum-backend"]
            served[backend] = served.get(backend, 0) + 1
            await eventually(lambda i=i: how(ing, "background") == i + 1)  # type: ignore[misc]
        # each engine: MAX_MISSING answers without ids, then not asked any more
        assert how(ing, "answer_ids_missing") == sum(min(n, MAX_MISSING) for n in served.values())
        assert how(ing, "answer_ids") == 0
        assert all(remote.wants_ids(b) == (n < MAX_MISSING) for b, n in served.items())
        assert not remote.wants_ids("not-in-the-group")
        assert any(n > MAX_MISSING for n in served.values())
        assert remote.texts is not None and remote.texts.find(remote_text_key(model, prompt)) is not None
