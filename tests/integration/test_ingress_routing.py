"""Every selection strategy over real HTTP, Tier 1 stickiness and overflow with the seed's labels,
and the KV scorer hook."""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Sequence

import httpx
import pytest

from continuum_common.hashing import request_prefix_key
from continuum_common.ring import HashRing
from continuum_ingress.policy.scorer import HoldingTier
from continuum_ingress.policy.strategies import CandidateView
from continuum_testing.ingress_harness import RunningIngress, running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs


def chat(system: str | None = None, text: str = "hi", **extra: object) -> dict[str, object]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return {"model": "m", "messages": messages, **extra}


def http(ing: RunningIngress) -> httpx.AsyncClient:
    # verify=False: loopback HTTP only, and it spares loading the CA bundle (~30 ms a client).
    return httpx.AsyncClient(base_url=ing.url, timeout=10, verify=False)


async def picks(
    client: httpx.AsyncClient, n: int, body: dict[str, object], headers: dict[str, str] | None = None
) -> list[str]:
    """The backends that served `n` identical requests, in order."""
    out = []
    for _ in range(n):
        r = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        out.append(r.headers["x-continuum-backend"])
    return out


async def metric(client: httpx.AsyncClient, name: str) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


async def test_round_robin_and_weighted_round_robin() -> None:
    async with running_stubs("a", "b", "c") as stubs:
        async with running_ingress({"backends": stub_backends(stubs)}) as ing, http(ing) as c:
            assert collections.Counter(await picks(c, 30, chat())) == {"a": 10, "b": 10, "c": 10}
        weighted = stub_backends(stubs)
        for entry, weight in zip(weighted, (3, 1, 1), strict=True):
            entry["weight"] = weight
        async with (
            running_ingress({"backends": weighted, "selection_strategy": "WeightedRoundRobin"}) as ing,
            http(ing) as c,
        ):
            assert collections.Counter(await picks(c, 50, chat())) == {"a": 30, "b": 10, "c": 10}


async def test_least_latency_prefers_the_fast_backend() -> None:
    async with running_stubs("slow", "fast", "slower") as stubs:
        stubs[0].stub.delay, stubs[2].stub.delay = 0.03, 0.06
        async with (
            running_ingress({"backends": stub_backends(stubs), "selection_strategy": "LeastLatency"}) as ing,
            http(ing) as c,
        ):
            counts = collections.Counter(await picks(c, 20, chat()))
    # Each backend is measured once (no sample yet), then the fast one takes everything.
    assert counts["fast"] >= 17 and counts["slow"] == 1 and counts["slower"] == 1


async def test_random_spreads_over_every_backend() -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = {"backends": stub_backends(stubs), "selection_strategy": "Random"}
        async with running_ingress(cfg, rng=random.Random(3)) as ing, http(ing) as c:
            counts = collections.Counter(await picks(c, 90, chat()))
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) >= 15


async def test_consistent_hash_on_session_header_and_user_field() -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = {"backends": stub_backends(stubs), "selection_strategy": "ConsistentHash"}
        async with running_ingress(cfg) as ing, http(ing) as c:
            by_header = await picks(c, 8, chat(), {"x-session-id": "conversation-1"})
            assert len(set(by_header)) == 1
            by_user = await picks(c, 8, chat(text="x", user="customer-9"))
            assert len(set(by_user)) == 1
            spread = set()
            for i in range(30):
                spread.update(await picks(c, 1, chat(), {"x-session-id": f"s-{i}"}))
            assert spread == {"a", "b", "c"}


async def test_prefix_aware_hash_keeps_one_system_prompt_on_one_backend() -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = {
            "backends": stub_backends(stubs),
            "selection_strategy": "PrefixAwareHash",
            "prefix_routing": {"enabled": True},
        }
        async with running_ingress(cfg) as ing, http(ing) as c:
            one = await picks(c, 20, chat("You are the billing assistant.", user="q1"))
            assert len(set(one)) == 1
            many = set()
            for i in range(40):
                many.update(await picks(c, 1, chat(f"Tenant {i} system prompt")))
            assert many == {"a", "b", "c"}
            labels = await metric(c, "continuum_prefix_routing_requests_total")
            assert labels == {
                '{strategy="prefix_hash"}': 60.0,
                '{strategy="overflow"}': 0.0,
                '{strategy="fallback"}': 0.0,
            }


async def test_prefix_aware_hash_overflows_past_the_bound_with_labels_counted() -> None:
    """Requests held in flight raise the owner's load; the walk follows the pure ring exactly."""
    hold = asyncio.Event()
    async with running_stubs("a", "b", "c") as stubs:
        for s in stubs:
            s.stub.hold = hold
        cfg = {
            "backends": stub_backends(stubs),
            "selection_strategy": "PrefixAwareHash",
            "prefix_routing": {"enabled": True, "load_factor_epsilon": 0.25, "virtual_nodes": 150},
        }
        body = chat("One shared, long system prompt.")
        key = request_prefix_key(body, enabled=True)
        ring = HashRing(["a", "b", "c"], virtual_nodes=150, epsilon=0.25)
        loads: dict[str, int] = {"a": 0, "b": 0, "c": 0}
        expected = []
        for _ in range(9):
            choice = ring.lookup(key, "m", loads)
            loads[choice.backend] += 1
            expected.append((choice.backend, choice.label.value))
        async with running_ingress(cfg) as ing, http(ing) as c:
            tasks = []
            for i in range(9):
                tasks.append(asyncio.create_task(c.post("/v1/chat/completions", json=body)))
                while sum(len(s.stub.requests) for s in stubs) < i + 1:  # one more in flight
                    await asyncio.sleep(0.005)
            dist = await metric(c, "continuum_prefix_routing_backend_distribution")
            assert sum(dist.values()) == 9.0
            hold.set()
            responses = await asyncio.gather(*tasks)
            got = [r.headers["x-continuum-backend"] for r in responses]
            assert got == [b for b, _ in expected]
            counts = collections.Counter(label for _, label in expected)
            assert counts["overflow"] > 0 and counts["prefix_hash"] > 0
            labels = await metric(c, "continuum_prefix_routing_requests_total")
            assert labels['{strategy="prefix_hash"}'] == counts["prefix_hash"]
            assert labels['{strategy="overflow"}'] == counts["overflow"]
            assert labels['{strategy="fallback"}'] == 0


async def test_prefix_aware_hash_without_prefix_routing_falls_back_to_the_model_hash() -> None:
    async with running_stubs("a", "b", "c") as stubs:
        cfg = {"backends": stub_backends(stubs), "selection_strategy": "PrefixAwareHash"}  # prefix routing off
        async with running_ingress(cfg) as ing, http(ing) as c:
            chosen = set()
            for i in range(10):
                chosen.update(await picks(c, 1, chat(f"system {i}")))
            assert len(chosen) == 1
            labels = await metric(c, "continuum_prefix_routing_requests_total")
            assert labels['{strategy="fallback"}'] == 10.0


class FixedScorer:
    def __init__(self, scores: dict[str, float], fail: bool = False) -> None:
        self.scores = scores
        self.fail = fail
        self.prepared = 0

    async def prepare(self, prefix_key: bytes, candidates: Sequence[CandidateView]) -> None:
        self.prepared += 1
        if self.fail:
            raise ConnectionError("index down")

    def score(self, prefix_key: bytes, backend: str) -> float:
        return self.scores.get(backend, 0.0)

    def score_with_tier(self, prefix_key: bytes, backend: str) -> tuple[float, HoldingTier]:
        score = self.scores.get(backend, 0.0)
        return score, HoldingTier.GPU_HOT if score else HoldingTier.NONE


@pytest.mark.parametrize(
    ("scores", "fail", "expect_c", "decision"),
    [
        ({"c": 0.9}, False, True, "kv_aware"),
        ({"c": 0.3}, False, False, "fallback"),  # the threshold is strict
        ({"c": 0.9}, True, False, None),  # a failing scorer never fails the request
    ],
)
async def test_kv_scorer_hook_runs_before_the_strategy(
    scores: dict[str, float], fail: bool, expect_c: bool, decision: str | None
) -> None:
    scorer = FixedScorer(scores, fail)
    async with running_stubs("a", "b", "c") as stubs:
        cfg = {"backends": stub_backends(stubs), "prefix_routing": {"enabled": True}}
        async with running_ingress(cfg, scorer=scorer) as ing, http(ing) as c:
            got = await picks(c, 6, chat("sys"))
            no_key = await picks(c, 3, {"model": "m", "messages": [{"role": "user", "content": ""}]})
            decisions = await metric(c, "continuum_kv_index_routing_decisions_total")
    assert scorer.prepared == 6  # only requests with a prefix key consult the scorer
    assert (got == ["c"] * 6) is expect_c
    assert len(no_key) == 3
    if decision == "kv_aware":
        assert decisions['{decision="kv_aware",tier="gpu_hot"}'] == 6
    elif decision == "fallback":
        assert decisions['{decision="fallback",tier="none"}'] == 6
    else:
        assert sum(decisions.values()) == 0


async def test_admin_prefix_routing_stats_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTINUUM_TEST_ADMIN", "admin-secret")
    async with running_stubs("a", "b") as stubs:
        cfg = {
            "backends": stub_backends(stubs),
            "selection_strategy": "PrefixAwareHash",
            "prefix_routing": {"enabled": True, "virtual_nodes": 64},
            "admin": {"token_env": "CONTINUUM_TEST_ADMIN"},
        }
        async with running_ingress(cfg) as ing, http(ing) as c:
            for i in range(25):
                await picks(c, 2, chat(f"prompt {i}"))
            r = await c.get("/admin/prefix-routing/stats", headers={"authorization": "Bearer admin-secret"})
    assert r.status_code == 200
    stats = r.json()
    assert stats == {
        "enabled": True,
        "config": {
            "max_prefix_length": 1024,
            "load_factor_epsilon": 0.25,
            "virtual_nodes": 64,
            "anthropic_cache_control_injection": False,
        },
        "routing_decisions": {"total": 50, "prefix_hash": 50, "overflow": 0, "fallback": 0, "overflow_rate": "0.0000"},
        "backend_distribution": [
            {"backend": "a", "in_flight_requests": 0},
            {"backend": "b", "in_flight_requests": 0},
        ],
        "unique_prefixes": 25,
    }
