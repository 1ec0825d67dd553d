"""The semantic cache inside the ingress: the embeddings come from a simulated vLLM engine
configured as an `internal: true` backend (it serves no client traffic), the answers from the
simulated fleet, the client is the official `openai` SDK, the store is a real redis-server.

The simulator's embeddings are a hashed bag of words and character trigrams (docs/sim-engine.md):
the paraphrases below score 0.91 and 0.87 against the question, the unrelated question 0.57, so
the tests use threshold 0.85. A paraphrase hits only inside its partition: the same words under
another system prompt or another API key miss.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from continuum_common.procs import RedisServer
from continuum_sim import SimFleet
from continuum_testing.cache_support import (
    ADMIN_ENV,
    ADMIN_TOKEN,
    cache_config,
    cache_stats,
    engine_requests,
    wait_entries,
)
from continuum_testing.ingress_harness import running_ingress

SYSTEM = "You are a biology tutor for teenagers. Keep answers short."
QUESTION = "Can you explain how photosynthesis works in green plants?"
PARAPHRASES = (
    "Could you explain how photosynthesis works in green plants?",
    "Explain how photosynthesis works in green plants, please.",
)
UNRELATED = "Can you explain how a steam engine works?"


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(2, time_scale=0.01) as running:
        yield running


async def _ask(
    url: str, model: str, question: str, *, system: str = SYSTEM, key: str = "sk-a", temperature: float | None = 0
) -> tuple[Any, ...]:
    messages: list[Any] = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    sampling: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
    async with openai.AsyncOpenAI(api_key=key, base_url=f"{url}/v1", max_retries=0, timeout=15) as oc:
        raw = await oc.chat.completions.with_raw_response.create(model=model, messages=messages, **sampling)
    raw.parse()
    assert raw.headers.get("x-continuum-backend") != "embedder"  # internal: never client traffic
    return raw.headers.get("x-cache"), raw.headers.get("x-cache-mode"), raw.content


async def test_semantic_hit_within_a_partition_only(fleet: SimFleet, redis_server: RedisServer) -> None:
    model = fleet.endpoints[0].model
    embedder = {"name": "embedder", "url": fleet.urls[0], "type": "vllm", "models": [model], "internal": True}
    semantic = {"enabled": True, "backend": "embedder", "embedding_model": model, "threshold": 0.85}
    cfg = cache_config(
        [*fleet.router_backends(), embedder], backend="redis", redis={"url": redis_server.url}, semantic=semantic
    )
    async with running_ingress(cfg) as ing:
        before = engine_requests(fleet)
        first = await _ask(ing.url, model, QUESTION)
        assert first[:2] == ("MISS", None)
        await wait_entries(ing.url, 2)  # the exact entry and the semantic body
        assert engine_requests(fleet) == before + 1
        for paraphrase in PARAPHRASES:
            hit = await _ask(ing.url, model, paraphrase)
            assert hit == ("HIT", "semantic", first[2])  # the first answer, byte for byte
        assert engine_requests(fleet) == before + 1  # embeddings calls are not chat requests

        # without a temperature the request samples at 1.0: neither cached nor answered from it
        assert (await _ask(ing.url, model, PARAPHRASES[0], temperature=None))[:2] == ("BYPASS", None)
        assert engine_requests(fleet) == before + 2
        before += 1

        assert (await _ask(ing.url, model, UNRELATED))[0] == "MISS"
        # Same words, another partition: another system prompt, another API key.
        assert (await _ask(ing.url, model, PARAPHRASES[0], system=SYSTEM + " Use metric units."))[0] == "MISS"
        assert (await _ask(ing.url, model, PARAPHRASES[0], key="sk-b"))[0] == "MISS"
        assert engine_requests(fleet) == before + 4

        stats = await cache_stats(ing.url)
        assert stats["semantic"]["hits"] == 2 and stats["requests"]["hit"] == 2
        client = aioredis.Redis(host=redis_server.host, port=redis_server.port)
        try:
            assert len(await client.keys("cr:resp:sem:*")) >= 1
        finally:
            await client.aclose()
