"""Tier 4 end to end with real processes and sockets: simulated vLLM engines → KV listener →
nats-server JetStream → indexer → redis-server → ingress scorer; and the same behaviour with the
embedded memory index (no indexer, no Redis: the ingress consumes JetStream itself).

One scenario per index backend, on engines with a small KV cache (39 usable blocks):

1. a prefix cached on engine 1 (deeper) and engine 0 (shallower) routes to engine 1, as a
   `kv_aware` decision, although the strategy (RoundRobin) alone would rotate;
2. a prefix nobody holds falls back to the strategy;
3. filling engine 1's cache evicts the prefix's blocks tail first: its token count in the index
   falls, its score with it, and the prefix now routes to engine 0;
4. `POST /reset_prefix_cache` on engine 0 (vLLM's AllBlocksCleared) removes engine 0's entries.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from continuum_common.procs import NatsServer, RedisServer
from continuum_ingress.kv.scorer import CACHE_TTL_S
from continuum_sim import EngineConfig
from continuum_testing.kv_stack import chat, key_of, kv_stack, words

SMALL_CACHE = EngineConfig(num_gpu_blocks=40, max_model_len=512)


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_kv_aware_routing_follows_the_engines_caches(
    backend: str, nats_server: NatsServer, redis_server: RedisServer, monkeypatch: Any
) -> None:
    redis = redis_server if backend == "redis" else None
    async with kv_stack(nats_server, redis, monkeypatch, engine=SMALL_CACHE, speculative_ttl_ms=0) as s:
        e0, e1 = s.name(0), s.name(1)
        system = "You are the catalogue assistant. " + words("sys", 150)
        prefix = key_of(chat(system, "warm"))
        await s.direct(1, chat(system, "warm", max_tokens=96))  # deeper chain on engine 1
        await s.direct(0, chat(system, "warm", max_tokens=4))
        held = await s.wait_holders(prefix, lambda h: h.keys() == {e0, e1} and h[e1] > h[e0])

        # 1. The index says engine 1 holds the most: every request goes there.
        routed = [await s.via_ingress(chat(system, f"question {i}")) for i in range(3)]
        assert routed == [e1, e1, e1]
        assert s.decisions("kv_aware") == 3 and s.decisions("fallback") == 0

        # 2. Nobody holds this one: the strategy decides.
        await s.via_ingress(chat("A system prompt no engine has seen. " + words("new", 40), "hi"))
        assert s.decisions("fallback") == 1

        # 3. Evict engine 1's copy by filling its cache with unrelated prompts.
        seen = [held[e1]]
        for i in range(40):
            await s.direct(1, chat(None, words(f"fill{i}-", 90)), salted=False)
            now = await s.holders(prefix)
            if now.get(e1, 0) != seen[-1]:
                seen.append(now.get(e1, 0))
            if now.get(e1, 0) < now.get(e0, 0):
                break
        assert seen == sorted(seen, reverse=True) and seen[-1] < held[e0], seen
        # The ingress caches a prefix's holders for CACHE_TTL_S; with fast loopback HTTP the fill
        # above can finish inside that window.
        await asyncio.sleep(CACHE_TTL_S * 1.5)
        assert await s.via_ingress(chat(system, "after eviction")) == e0
        assert s.decisions("kv_aware") == 4

        # 4. AllBlocksCleared on engine 0: its entries leave the index.
        other = chat("Another prompt only engine 0 holds. " + words("zero", 60), "x")
        await s.direct(0, other)
        await s.wait_holders(key_of(other), lambda h: e0 in h)
        assert (await s.http.post(s.url(0) + "/reset_prefix_cache")).status_code == 200
        await s.wait_holders(key_of(other), lambda h: e0 not in h)
        assert e0 not in await s.holders(prefix)
        await s.via_ingress(other)  # nobody holds it any more
        assert s.decisions("fallback") == 2
