"""Simulated vLLM engines → listener → JetStream, in both prefix-key modes and in block mode.

The engines are real `continuum_sim` servers (OpenAI API, vLLM block pool, vLLM-format ZMQ KV
events, /detokenize); the listener runs in-process against a real nats-server; requests go over
HTTP. Expected prefix keys are computed with the ingress's own function.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import nats
import pytest

from continuum_common.config.listener import ListenerConfig
from continuum_common.events import STREAM_NAME, EventType, KvEvent, decode_event
from continuum_common.hashing import request_prefix_key
from continuum_common.procs import NatsServer, free_port
from continuum_common.salt import make_salt
from continuum_common.wire.kv import AllCleared, BlocksStored, KvBatch, decode_batch
from continuum_listener.app import ListenerApp, running
from continuum_listener.config import settings_from
from continuum_sim import EngineConfig, KvEventsConfig, SimFleet, Tokenizer, render_chat
from continuum_sim.protocol.block_hash import chain_hashes, none_hash, vllm_wire_hash
from continuum_sim.protocol.chat_template import parse_messages

SECRET = "sim-e2e-secret"
BLOCK = 16


def body(system: str | None, user: str, max_tokens: int = 8) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user}
    ]
    return {"model": "continuum-sim-8b", "messages": messages, "max_tokens": max_tokens, "temperature": 0}


def prompt_tokens(request: dict[str, Any]) -> int:
    return len(Tokenizer().encode(render_chat(parse_messages(request["messages"]))))


@contextlib.asynccontextmanager
async def stack(nats_url: str, mode: str, monkeypatch: Any) -> AsyncIterator[tuple[SimFleet, ListenerApp]]:
    monkeypatch.setenv("CONTINUUM_SIM_E2E_SALT", SECRET)
    async with SimFleet(1, time_scale=0.001) as fleet:
        sources = fleet.listener_sources()
        for source in sources:
            source["prefix_key_mode"] = mode
            source["publish"] = "prefix"
            if mode == "salt_echo":
                source.pop("detokenize_endpoint", None)
        cfg = ListenerConfig.model_validate(
            {
                "listen": "127.0.0.1:0",
                "bus": {"embedded": False, "url": nats_url},
                "salt": {"secret_env": "CONTINUUM_SIM_E2E_SALT"},
                "limits": {"coalesce_window_ms": 20},
                "sources": sources,
            }
        )
        async with running(settings_from(cfg)) as app:
            pipeline = app.pipelines[fleet.endpoints[0].name]
            async with asyncio.timeout(10):
                while not pipeline.stats.connected:
                    await asyncio.sleep(0.02)
            yield fleet, app


async def chat(fleet: SimFleet, request: dict[str, Any]) -> None:
    async with httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as client:
        response = await client.post("/v1/chat/completions", json=request)
        assert response.status_code == 200, response.text


async def wait_for_keys(url: str, keys: set[str], *, timeout: float = 20.0) -> list[KvEvent]:
    """Every event in the stream, once each of `keys` has a `created` event."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        seen: list[KvEvent] = []
        next_seq = 1
        async with asyncio.timeout(timeout):
            while True:
                try:
                    last = (await js.stream_info(STREAM_NAME)).state.last_seq
                except Exception:
                    last = 0
                while next_seq <= last:
                    seen.append(decode_event((await js.get_msg(STREAM_NAME, next_seq)).data or b""))
                    next_seq += 1
                created = {e.prefix_hash for e in seen if e.type is EventType.CREATED}
                if keys <= created:
                    return seen
                await asyncio.sleep(0.05)
    finally:
        await nc.close()


def deepest(events: list[KvEvent], key: str) -> int:
    depth = 0
    for event in events:
        if event.prefix_hash == key and event.tier.value == "gpu_hot":
            depth = event.token_count
    return depth


async def test_salt_echo_sim_engine_to_jetstream(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with stack(nats_server.url, "salt_echo", monkeypatch) as (fleet, app):
        backend = fleet.endpoints[0].name
        requests = [body("You are a terse assistant.", "hello"), body(None, "What is the capital of France?")]
        keys = []
        for request in requests:
            key = request_prefix_key(request, enabled=True)
            assert key is not None
            keys.append(key.hex())
            await chat(fleet, {**request, "cache_salt": make_salt(SECRET.encode(), backend, key)})
        forged = body("A system prompt nobody salted correctly.", "x")
        forged_key = request_prefix_key(forged, enabled=True)
        assert forged_key is not None
        await chat(fleet, {**forged, "cache_salt": make_salt(b"wrong-secret", backend, forged_key)})
        await chat(fleet, body("No salt at all on this one.", "y"))
        events = await wait_for_keys(nats_server.url, set(keys))
        assert events[0].type is EventType.CLEARED and all(e.backend == backend for e in events)
        for request, key in zip(requests, keys, strict=True):
            floor = prompt_tokens(request) // BLOCK * BLOCK
            depth = deepest(events, key)
            assert depth % BLOCK == 0 and floor <= depth <= prompt_tokens(request) + request["max_tokens"]
        await asyncio.sleep(0.3)  # give any wrongly attributed chain time to show up
        events = await wait_for_keys(nats_server.url, set(keys))
        announced = {e.prefix_hash for e in events if e.prefix_hash}
        assert announced == set(keys)  # the forged and the unsalted chains were discarded
        sample = app.metrics.sample
        assert sample("continuum_kv_listener_chain_events_total", {"backend": backend, "what": "salt_invalid"}) >= 1
        assert sample("continuum_kv_listener_chain_events_total", {"backend": backend, "what": "salt_missing"}) >= 1
        # The engine resets its prefix cache: AllBlocksCleared → `cleared`.
        async with httpx.AsyncClient(base_url=fleet.urls[0]) as client:
            assert (await client.post("/reset_prefix_cache")).status_code == 200
        async with asyncio.timeout(10):
            while True:
                events = await wait_for_keys(nats_server.url, set(keys))
                if [e.type for e in events].count(EventType.CLEARED) >= 2:
                    break
                await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["detokenize", "auto"])
async def test_detokenize_sim_engine_to_jetstream(nats_server: NatsServer, monkeypatch: Any, mode: str) -> None:
    async with stack(nats_server.url, mode, monkeypatch) as (fleet, app):
        backend = fleet.endpoints[0].name
        # Only full blocks are cached, so an anchor is attributable once a full block covers its
        # end (or max_prefix_length bytes of it): max_tokens 32 guarantees that here.
        requests = [
            body("You are a helpful assistant who answers briefly.", "Tell me about KV caches.", 32),
            body(None, "A conversation without a system prompt starts here, and it goes on for a while.", 32),
            body("Policy: " + "follow every rule in this long document. " * 60, "long system prompt", 32),
            body("Policy: " + "follow every rule in this long document. " * 60, "same prompt, other question", 32),
        ]
        for request in requests:
            await chat(fleet, request)
        keys = {k.hex() for r in requests if (k := request_prefix_key(r, enabled=True)) is not None}
        assert len(keys) == 3
        events = await wait_for_keys(nats_server.url, keys)
        for request in requests[:2]:
            key = request_prefix_key(request, enabled=True)
            assert key is not None
            assert deepest(events, key.hex()) >= prompt_tokens(request) // BLOCK * BLOCK
        assert {e.prefix_hash for e in events if e.prefix_hash} == keys
        sample = app.metrics.sample
        assert sample("continuum_kv_listener_detokenize_total", {"backend": backend, "outcome": "determined"}) >= 3


async def test_engine_dials_a_binding_listener(nats_server: NatsServer, monkeypatch: Any) -> None:
    """vLLM's default for a tcp://host:port endpoint: the engine connects, the listener binds
    and admits only allowed publishers."""
    monkeypatch.setenv("CONTINUUM_SIM_E2E_SALT", SECRET)
    port = free_port()
    kv = KvEventsConfig(endpoint=f"tcp://127.0.0.1:{port}", zmq_mode="connect", replay_endpoint=None)
    config = replace(EngineConfig(name="sim-dial"), kv_events=kv)
    async with SimFleet(configs=[config], time_scale=0.001) as fleet:
        (source,) = fleet.listener_sources()
        assert source["zmq_mode"] == "bind"
        source.update(prefix_key_mode="salt_echo", allowed_publishers=["127.0.0.1"], publish="prefix")
        source.pop("detokenize_endpoint", None)
        cfg = ListenerConfig.model_validate(
            {"listen": "127.0.0.1:0", "bus": {"embedded": False, "url": nats_server.url},
             "salt": {"secret_env": "CONTINUUM_SIM_E2E_SALT"}, "sources": [source]}
        )  # fmt: skip
        async with running(settings_from(cfg)) as app:
            async with asyncio.timeout(10):
                while not app.pipelines["sim-dial"].stats.connected:
                    await asyncio.sleep(0.02)
            request = body("Dial-in engines are welcome here.", "hello", 32)
            key = request_prefix_key(request, enabled=True)
            assert key is not None
            await chat(fleet, {**request, "cache_salt": make_salt(SECRET.encode(), "sim-dial", key)})
            events = await wait_for_keys(nats_server.url, {key.hex()})
            assert deepest(events, key.hex()) >= prompt_tokens(request) // BLOCK * BLOCK


async def test_block_mode_publishes_the_engines_own_block_hashes(nats_server: NatsServer) -> None:
    """`publish: blocks`: the hashes in the stream are the ones the ingress recomputes from a
    request's tokens (vLLM sha256_cbor, PYTHONHASHSEED 0, last 8 bytes)."""
    async with SimFleet(1, time_scale=0.001) as fleet:
        sources = fleet.listener_sources()
        for source in sources:
            source["publish"] = "blocks"
        cfg = ListenerConfig.model_validate(
            {"listen": "127.0.0.1:0", "bus": {"embedded": False, "url": nats_server.url}, "sources": sources}
        )
        async with running(settings_from(cfg)) as app:
            backend = fleet.endpoints[0].name
            async with asyncio.timeout(10):
                while not app.pipelines[backend].stats.connected:
                    await asyncio.sleep(0.02)
            request = body("You hold blocks, and the router knows which ones.", "Which blocks do you hold?", 24)
            await chat(fleet, request)
            tokens = Tokenizer().encode(render_chat(parse_messages(request["messages"])))
            expected = [int(vllm_wire_hash(d, "int")) for d in chain_hashes(tokens, BLOCK, none_hash("0"))]
            assert len(expected) >= 2
            nc = await nats.connect(nats_server.url)
            try:
                js = nc.jetstream()
                stored: list[int] = []
                batches: list[KvBatch] = []
                async with asyncio.timeout(15):
                    while not set(expected) <= set(stored):
                        last = (await js.stream_info(STREAM_NAME)).state.last_seq
                        while len(batches) < last:
                            batches.append(decode_batch((await js.get_msg(STREAM_NAME, len(batches) + 1)).data or b""))
                            stored.extend(
                                h for e in batches[-1].events if isinstance(e, BlocksStored) for h in e.hashes
                            )
                        await asyncio.sleep(0.05)
            finally:
                await nc.close()
            assert batches[0].events == [AllCleared()] and all(b.backend == backend for b in batches)
            assert stored[: len(expected)] == expected  # the prompt's blocks, in chain order
