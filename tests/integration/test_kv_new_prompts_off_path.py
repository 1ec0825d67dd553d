"""`tokenize_new_prompts: off_path` in a real ingress in front of real simulated engines over
loopback HTTP: a request too little of which is remembered is routed at once with approximate
keys (no `/tokenize` on its path), a burst of it stays together, and it is tokenized once
answered, so what follows it is matched precisely (docs/kv-scorer.md, "Remembered
tokenizations")."""

from __future__ import annotations

import asyncio

from continuum_common.procs import NatsServer
from tests.integration.test_kv_remote_tokenize import (
    SYSTEM,
    ask,
    assert_learnt,
    assert_text_learnt,
    complete,
    eventually,
    how,
    stack,
)


async def test_a_new_conversation_goes_at_once_and_is_learnt_after_its_answer(nats_server: NatsServer) -> None:
    async with stack(nats_server.url, time_scale=0.2, tokenize_new_prompts="off_path") as (fleet, ing, client):
        model = fleet.endpoints[0].model
        group = ing.app.kv.selector.groups["fleet"]  # type: ignore[union-attr]
        assert group.fallback_memory is not None
        # a long answer from slowed engines: the first request is still running when its
        # sibling arrives
        long = {"model": model, "messages": [SYSTEM, {"role": "user", "content": "What was the revenue?"}]}
        first = asyncio.create_task(client.post("/v1/chat/completions", json={**long, "max_tokens": 300}))
        await eventually(lambda: len(group.fallback_memory) > 0)  # type: ignore[arg-type]
        assert not first.done()
        # a sibling while the first is in flight: nothing is learnt yet, so it is new too, and
        # matched approximately against where the first went (RoundRobin and the demand of
        # new work would both have sent it to the other engine)
        sibling = await ask(client, model, [SYSTEM, {"role": "user", "content": "And the costs?"}])
        response = await first
        assert response.status_code == 200, response.text
        home = response.headers["x-continuum-backend"]
        assert sibling == home
        assert how(ing, "new") == 2 and how(ing, "request") == 0

        # once answered: the shared part and the conversations with their answers, learnt off
        # the path, are the engine's own block hashes
        await eventually(lambda: how(ing, "background") == 3)
        assert how(ing, "answer") == 2 and how(ing, "background_failed") == 0
        await assert_learnt(ing, fleet, [SYSTEM])

        # what follows is matched precisely, still without a call on its path
        third = [SYSTEM, {"role": "user", "content": "What about the outlook?"}]
        assert await ask(client, model, third) == home
        assert how(ing, "known_prefix") == 1 and how(ing, "request") == 0 and how(ing, "new") == 2


async def test_a_new_completion_prompt_is_learnt_after_its_answer(nats_server: NatsServer) -> None:
    async with stack(nats_server.url, tokenize_new_prompts="off_path") as (fleet, ing, client):
        model = fleet.endpoints[0].model
        turn1 = "The quarterly report covers revenue, costs and the outlook for next year. " * 80
        home = await complete(client, model, turn1)
        assert how(ing, "new") == 1 and how(ing, "request") == 0
        await eventually(lambda: how(ing, "background") == 1)
        await assert_text_learnt(ing, fleet, turn1)

        # the next turn extends it: matched by what was learnt, no call, same engine
        assert await complete(client, model, turn1 + "Answer: revenue grew. Question: and the costs? ") == home
        assert how(ing, "known_prefix") == 1 and how(ing, "request") == 0 and how(ing, "new") == 1
