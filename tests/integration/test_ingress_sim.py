"""The official SDKs through the ingress to simulated vLLM engines (continuum_sim.SimFleet), and
what Tier 1 buys: repeated system prompts hit the engine's prefix cache."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import httpx
import openai
import pytest
import pytest_asyncio

from continuum_common.hashing import request_prefix_key
from continuum_common.salt import make_salt
from continuum_sim import SimFleet
from continuum_testing.ingress_harness import running_ingress

SYSTEM = "You are the support assistant of a large shop. Answer briefly and politely. " * 6


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(3, time_scale=0.01) as running:
        yield running


def _config(fleet: SimFleet, strategy: str, **extra: object) -> dict[str, object]:
    return {
        "backends": fleet.router_backends(),
        "selection_strategy": strategy,
        "prefix_routing": {"enabled": True},
        **extra,
    }


def _reset(fleet: SimFleet) -> None:
    for engine in fleet.engines:
        engine.reset_prefix_cache()


async def test_sdks_stream_and_non_stream_through_the_ingress(fleet: SimFleet) -> None:
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet, "PrefixAwareHash")) as ing:
        oc = openai.AsyncOpenAI(api_key="unused", base_url=f"{ing.url}/v1", max_retries=0)
        chat = await oc.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
            max_tokens=8,
        )
        assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens <= 8
        stream = await oc.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage is not None and chunks[-1].choices == []
        completion = await oc.completions.create(model=model, prompt="Once upon a time", max_tokens=5)
        assert completion.choices[0].text
        embeddings = await oc.embeddings.create(model=model, input=["a", "b"])
        assert len(embeddings.data) == 2 and len(embeddings.data[0].embedding) > 0
        ac = anthropic.AsyncAnthropic(api_key="unused", base_url=f"{ing.url}/anthropic", max_retries=0)
        msg = await ac.messages.create(
            model=model, max_tokens=8, system=SYSTEM, messages=[{"role": "user", "content": "hi"}]
        )
        assert msg.content[0].text  # type: ignore[union-attr]
        async with ac.messages.stream(model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as st:
            text = "".join([t async for t in st.text_stream])
        assert text
        # Anthropic's own path at the root, where vLLM serves it: the SDK without `/anthropic`.
        root = anthropic.AsyncAnthropic(api_key="unused", base_url=ing.url, max_retries=0)
        msg = await root.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert msg.content[0].text  # type: ignore[union-attr]
        # OpenAI Responses, both ways.
        response = await oc.responses.create(model=model, instructions=SYSTEM, input="hi", max_output_tokens=8)
        assert response.output_text and response.usage is not None and response.usage.output_tokens <= 8
        events = [e async for e in await oc.responses.create(model=model, input="hi", max_output_tokens=8, stream=True)]
        assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta")
        await oc.close()
        await ac.close()
        await root.close()


async def _cached(oc: openai.AsyncOpenAI, model: str, system: str, user: str) -> tuple[int, str]:
    raw = await oc.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "system", "content": system}, {"role": "user", "content": user}], max_tokens=4
    )
    reply = raw.parse()
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0, raw.headers["x-continuum-backend"]


@pytest.mark.parametrize("strategy", ["PrefixAwareHash", "RoundRobin"])
async def test_tier1_keeps_the_prefix_cache_warm(fleet: SimFleet, strategy: str) -> None:
    """PrefixAwareHash sends one system prompt to one engine, so every repeat is a prefix-cache
    hit; RoundRobin visits each engine cold once."""
    _reset(fleet)
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet, strategy)) as ing:
        oc = openai.AsyncOpenAI(api_key="unused", base_url=f"{ing.url}/v1", max_retries=0)
        results = [await _cached(oc, model, SYSTEM, f"question {i}") for i in range(6)]
        await oc.close()  # explicitly: see test_ingress_sdk.py on clients left to the GC
    cached = [c for c, _ in results]
    engines = [e for _, e in results]
    if strategy == "PrefixAwareHash":
        assert len(set(engines)) == 1
        assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    else:
        assert len(set(engines)) == 3
        assert cached[:3] == [0, 0, 0] and all(c > 0 for c in cached[3:])


async def test_tier1_sends_one_instructions_to_one_engine_over_the_responses_api(fleet: SimFleet) -> None:
    """A Responses request's prefix key is its chat form's: `instructions` anchor it as a system
    prompt does, so PrefixAwareHash keeps them on one engine and every repeat is a cache hit."""
    _reset(fleet)
    model = fleet.endpoints[0].model
    async with running_ingress(_config(fleet, "PrefixAwareHash")) as ing:
        oc = openai.AsyncOpenAI(api_key="unused", base_url=f"{ing.url}/v1", max_retries=0)
        engines, cached = set(), []
        for i in range(6):
            raw = await oc.responses.with_raw_response.create(
                model=model, instructions=SYSTEM, input=f"question {i}", max_output_tokens=4
            )
            engines.add(raw.headers["x-continuum-backend"])
            usage = raw.parse().usage
            assert usage is not None
            cached.append(usage.input_tokens_details.cached_tokens)
        await oc.close()
        routed = ing.app.metrics.registry.get_sample_value(
            "continuum_prefix_routing_requests_total", {"strategy": "prefix_hash"}
        )
    assert routed == 6  # by the instructions' key, not the fallback a keyless request gets
    assert len(engines) == 1
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])


async def test_salt_echo_reaches_the_engine_and_keeps_cache_hits(
    fleet: SimFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM only shares blocks between equal salts; equal prefix keys on one backend give equal
    salts, so Tier 1 plus salt echo still hits the cache."""
    _reset(fleet)
    monkeypatch.setenv("CONTINUUM_TEST_SALT", "shared-with-the-listener")
    model = fleet.endpoints[0].model
    cfg = _config(
        fleet,
        "PrefixAwareHash",
        kv_cache_index={
            "salt_echo": {"enabled": True, "secret_env": "CONTINUUM_TEST_SALT"},
            "default_mode": "prefix_key",
        },
    )
    async with running_ingress(cfg) as ing:
        oc = openai.AsyncOpenAI(api_key="unused", base_url=f"{ing.url}/v1", max_retries=0)
        results = [await _cached(oc, model, SYSTEM, f"q{i}") for i in range(3)]
        await oc.close()
        salts = (await ing_metrics(ing.url)).count("continuum_salt_echo_requests_total 3.0")
    assert [c > 0 for c, _ in results] == [False, True, True]
    assert salts == 1
    # Straight to the engine that served them: without the salt the prompt is cold (its blocks
    # were stored under the salt); with make_salt(secret, engine, prefix key) it is warm, so that
    # is exactly the salt the ingress sent.
    engine = next(e for e in fleet.endpoints if e.name == results[0][1])
    direct = openai.AsyncOpenAI(api_key="unused", base_url=engine.openai_base_url, max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q0"}]
    key = request_prefix_key({"model": model, "messages": messages}, enabled=True)
    assert key is not None
    salt = make_salt(b"shared-with-the-listener", engine.name, key)
    unsalted = await direct.chat.completions.create(model=model, messages=messages, max_tokens=2)  # type: ignore[arg-type]
    salted = await direct.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=2,
        extra_body={"cache_salt": salt},  # type: ignore[arg-type]
    )
    await direct.close()
    assert unsalted.usage is not None and unsalted.usage.prompt_tokens_details is not None
    assert salted.usage is not None and salted.usage.prompt_tokens_details is not None
    assert unsalted.usage.prompt_tokens_details.cached_tokens == 0
    assert (salted.usage.prompt_tokens_details.cached_tokens or 0) > 0


async def ing_metrics(url: str) -> str:
    async with httpx.AsyncClient(verify=False) as client:
        return (await client.get(f"{url}/metrics")).text
