"""Precise KV matching end to end with a real tokenizer on both sides: simulated vLLM engines
running a trained byte-level BPE (`--tokenizer`), the listener publishing their block events,
the embedded block index, and an ingress tokenizing locally with the same files. Speculative
entries are off, so every KV-aware decision rests on the engines' own reports. And the audit:
an ingress whose tokenizer differs from the engines' turns precise matching off by itself."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest

from continuum_common.config.listener import ListenerConfig
from continuum_common.procs import NatsServer
from continuum_listener.app import running
from continuum_listener.config import settings_from
from continuum_sim import EngineConfig, SimFleet
from continuum_sim.hf_tokenizer import TokenizerFiles, train_tokenizer
from continuum_testing.ingress_harness import RunningIngress, running_ingress

MODEL = "continuum-sim-8b"
SYSTEM = "You are the support assistant of a large hardware store. Be precise and short. " * 12


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> TokenizerFiles:
    return train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=2048)


@contextlib.asynccontextmanager
async def engines(nats_url: str, files: TokenizerFiles | None) -> AsyncIterator[SimFleet]:
    base = EngineConfig(num_gpu_blocks=2048, max_model_len=8192)
    if files is not None:
        base = replace(base, tokenizer=str(files.tokenizer), chat_template=str(files.chat_template))
    async with SimFleet(3, config=base, time_scale=0.01) as fleet:
        sources = [{**s, "publish": "blocks"} for s in fleet.listener_sources()]
        cfg = ListenerConfig.model_validate(
            {"listen": "127.0.0.1:0", "bus": {"embedded": False, "url": nats_url}, "sources": sources}
        )
        async with running(settings_from(cfg, source="test")):
            yield fleet


def config(fleet: SimFleet, nats_url: str, files: TokenizerFiles | None, **kv: Any) -> dict[str, Any]:
    """`files` None: no local tokenizer, the ingress asks the engines' /tokenize."""
    group: dict[str, Any] = {
        "name": "sims", "models": [MODEL], "mode": "precise", "engine": "vllm", "block_size": 16,
        "hash_seed": fleet.endpoints[0].python_hash_seed,
    }  # fmt: skip
    if files is not None:
        group.update(tokenizer=str(files.tokenizer), chat_template=str(files.chat_template))
    return {
        "backends": [{**b, "health_check_interval_ms": 200} for b in fleet.router_backends()],
        "selection_strategy": "RoundRobin",
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats_url},
        "kv_cache_index": {"enabled": True, "backend": "memory", "groups": [group], **kv},
    }


def decisions(ing: RunningIngress, decision: str) -> float:
    total = 0.0
    for tier in ("gpu_hot", "storage_warm", "none"):
        total += (
            ing.app.metrics.registry.get_sample_value(
                "continuum_kv_index_routing_decisions_total", {"decision": decision, "tier": tier}
            )
            or 0.0
        )
    return total


def chat(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0}


async def test_the_engines_block_events_route_a_conversation(nats_server: NatsServer, files: TokenizerFiles) -> None:
    async with (
        engines(nats_server.url, files) as fleet,
        running_ingress(config(fleet, nats_server.url, files, speculative_ttl_ms=0)) as ing,
        httpx.AsyncClient(base_url=ing.url, timeout=30) as c,
    ):
        assert ing.app.kv is not None
        async with asyncio.timeout(10):
            await ing.app.kv.ready.wait()
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where are the hammers?"}]
        first = await c.post("/v1/chat/completions", json=chat(messages))
        assert first.status_code == 200
        home = first.headers["x-continuum-backend"]
        await wait_for_blocks(ing, home)
        for turn in range(4):
            messages = [
                *messages,
                {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"And question number {turn}?"},
            ]
            r = await c.post("/v1/chat/completions", json=chat(messages))
            assert r.status_code == 200
            assert r.headers["x-continuum-backend"] == home  # RoundRobin alone would rotate
            usage = r.json()["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] > 0.5 * usage["prompt_tokens"]
            await asyncio.sleep(0.2)  # the engine reports the new blocks of this turn
        assert decisions(ing, "kv_aware") >= 4


async def wait_for_blocks(ing: RunningIngress, backend: str) -> None:
    assert ing.app.kv is not None
    blocks = ing.app.kv.embedded.blocks  # type: ignore[union-attr]
    async with asyncio.timeout(10):  # the engine's events reach the embedded index
        while not (await blocks.block_stats()).backends.get(backend):
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("local", [True, False], ids=["local-tokenizer", "engine-tokenize"])
async def test_a_responses_api_conversation_stays_with_its_cache(
    nats_server: NatsServer, files: TokenizerFiles, local: bool
) -> None:
    """OpenAI Responses requests (the official SDK through the router): the ingress matches the
    prompt the engine templates from `instructions` and the input items, so each next turn goes
    to the engine holding the conversation and is served from its cache."""
    async with (
        engines(nats_server.url, files) as fleet,
        running_ingress(config(fleet, nats_server.url, files if local else None, speculative_ttl_ms=0)) as ing,
        openai.AsyncOpenAI(api_key="unused", base_url=f"{ing.url}/v1", max_retries=0, timeout=30) as client,
    ):
        assert ing.app.kv is not None
        async with asyncio.timeout(10):
            await ing.app.kv.ready.wait()
        items: list[dict[str, Any]] = [{"role": "user", "content": "Where are the hammers?"}]
        raw = await client.responses.with_raw_response.create(
            model=MODEL,
            instructions=SYSTEM,
            input=items,
            max_output_tokens=24,  # type: ignore[arg-type]
        )
        home = raw.headers["x-continuum-backend"]
        answer = raw.parse().output_text
        await wait_for_blocks(ing, home)
        for turn in range(4):
            items = [
                *items,
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
                {"role": "user", "content": [{"type": "input_text", "text": f"And question number {turn}?"}]},
            ]
            raw = await client.responses.with_raw_response.create(
                model=MODEL,
                instructions=SYSTEM,
                input=items,
                max_output_tokens=24,  # type: ignore[arg-type]
            )
            assert raw.headers["x-continuum-backend"] == home  # RoundRobin alone would rotate
            response = raw.parse()
            answer = response.output_text
            assert response.usage is not None
            assert response.usage.input_tokens_details.cached_tokens > 0.5 * response.usage.input_tokens
            await asyncio.sleep(0.2)  # the engine reports the new blocks of this turn
        assert decisions(ing, "kv_aware") >= 4


async def test_a_tokenizer_that_disagrees_with_the_engines_turns_precise_off(
    nats_server: NatsServer, files: TokenizerFiles
) -> None:
    # The engines run their built-in tokenizer; the ingress is given the trained BPE.
    async with (
        engines(nats_server.url, None) as fleet,
        running_ingress(config(fleet, nats_server.url, files)) as ing,
        httpx.AsyncClient(base_url=ing.url, timeout=30) as c,
    ):
        kv = ing.app.kv
        assert kv is not None
        audit = kv.selector.audits["sims"]
        audit.every = 1
        for i in range(6):
            body = chat([{"role": "user", "content": f"Tell me about item {i}. " * 30}])
            assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
            await asyncio.sleep(0.3)  # one audit at a time
        assert kv.selector.groups["sims"].precise_disabled == "tokenizer_mismatch"
        metrics = (await c.get("/metrics")).text
        mismatches = re.search(r'continuum_kv_tokenizer_audits_total\{group="sims",result="mismatch"\} (\S+)', metrics)
        assert mismatches is not None and float(mismatches.group(1)) >= 3
        assert 'continuum_kv_precise_fallbacks_total{group="sims",reason="disabled"}' in metrics
