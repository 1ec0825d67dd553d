"""Scorer threshold, circuit breaker, cache_control rules, HyperLogLog, pool bookkeeping."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from continuum_common.config import Backend
from continuum_ingress.hyperloglog import HyperLogLog
from continuum_ingress.policy.breaker import BreakerState, CircuitBreaker
from continuum_ingress.policy.cache_control import has_cache_control, inject_cache_control, should_inject
from continuum_ingress.policy.scorer import HoldingTier, best_scored
from continuum_ingress.policy.strategies import CandidateView
from continuum_ingress.pool import HEALTH_FAILURES_TO_DOWN, BackendPool, BackendState


class FixedScorer:
    def __init__(self, scores: dict[str, tuple[float, HoldingTier]]) -> None:
        self.scores = scores

    async def prepare(self, prefix_key: bytes, candidates: Sequence[CandidateView]) -> None:
        return None

    def score(self, prefix_key: bytes, backend: str) -> float:
        return self.score_with_tier(prefix_key, backend)[0]

    def score_with_tier(self, prefix_key: bytes, backend: str) -> tuple[float, HoldingTier]:
        return self.scores.get(backend, (0.0, HoldingTier.NONE))


def _states(*names: str) -> list[BackendState]:
    return [BackendState(Backend(name=n, url="http://127.0.0.1:1")) for n in names]


def test_scorer_threshold_is_strictly_greater_than_0_3() -> None:
    cands = _states("a", "b")
    at = FixedScorer({"a": (0.3, HoldingTier.GPU_HOT)})
    assert best_scored(at, b"k", cands) is None
    above = FixedScorer({"a": (0.30001, HoldingTier.GPU_HOT), "b": (0.9, HoldingTier.STORAGE_WARM)})
    best = best_scored(above, b"k", cands)
    assert best is not None and (best.backend, best.tier) == ("b", HoldingTier.STORAGE_WARM)


def test_breaker_opens_after_threshold_and_half_opens_for_one_trial() -> None:
    br = CircuitBreaker(threshold=3, open_seconds=5.0, max_open_seconds=20.0)
    for _ in range(2):
        br.on_failure(0.0)
    assert br.available(0.0)
    br.on_failure(1.0)
    assert br.state is BreakerState.OPEN and not br.available(5.9)
    assert br.available(6.0)
    br.on_start(6.0)
    assert br.state is BreakerState.HALF_OPEN and not br.available(6.0)  # one trial at a time
    br.on_failure(6.5)  # trial failed: open for twice as long
    assert br.state is BreakerState.OPEN and not br.available(16.4) and br.available(16.5)
    br.on_start(17.0)
    br.on_success()
    assert br.state is BreakerState.CLOSED and br.available(17.0)
    br.on_failure(18.0)  # a single failure after recovery does not reopen
    assert br.available(18.0)


def test_breaker_abandoned_trial_frees_the_slot() -> None:
    br = CircuitBreaker(threshold=1, open_seconds=1.0)
    br.on_failure(0.0)
    br.on_start(2.0)
    assert not br.available(2.0)
    br.on_abandon(2.1)
    assert br.available(2.1)


def test_cache_control_rules() -> None:
    assert should_inject("anthropic", True, False)
    assert should_inject("anthropic", False, True)  # the fleet flag forces it
    assert not should_inject("anthropic", False, False)
    assert not should_inject("vllm", True, True)  # native Anthropic backends only
    body = {"model": "c", "system": "be brief", "messages": [{"role": "user", "content": "x"}]}
    new = inject_cache_control(body)
    assert new is not None and new["system"] == [
        {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["system"] == "be brief"  # the caller's body is untouched
    blocks = {**body, "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    new = inject_cache_control(blocks)
    assert (
        new is not None
        and "cache_control" not in new["system"][0]
        and new["system"][1]["cache_control"] == {"type": "ephemeral"}
    )
    assert "cache_control" not in blocks["system"][1]
    assert inject_cache_control({"model": "c", "messages": []}) is None  # no system prompt
    assert inject_cache_control({**body, "system": ""}) is None
    for already in (
        {**body, "cache_control": {"type": "ephemeral"}},
        {
            **body,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}
            ],
        },
        {**body, "tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]},
        {**body, "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
    ):
        assert has_cache_control(already) and inject_cache_control(already) is None


def test_hyperloglog_estimates_within_a_few_percent() -> None:
    hll = HyperLogLog()
    assert hll.count() == 0
    for i in range(5000):
        hll.add(hashlib.sha256(f"prefix-{i}".encode()).digest())
    for i in range(5000):  # duplicates add nothing
        hll.add(hashlib.sha256(f"prefix-{i}".encode()).digest())
    assert abs(hll.count() - 5000) < 5000 * 0.05
    small = HyperLogLog()
    for i in range(10):
        small.add(hashlib.sha256(str(i).encode()).digest())
    assert small.count() == 10
    small.clear()
    assert small.count() == 0


def test_pool_tracks_outcomes_and_survives_sync() -> None:
    pool = BackendPool()
    pool.sync([Backend(name="a", url="http://127.0.0.1:1"), Backend(name="b", url="http://127.0.0.1:2")])
    a = pool.get("a")
    assert a is not None and a.success_rate == 1.0 and a.latency is None
    a.begin(0.0)
    a.record_success(0.1)
    a.finish()
    a.begin(0.0)
    a.record_failure(0.0)
    a.finish()
    a.begin(0.0)
    assert a.in_flight == 1 and a.success_rate == 0.5 and a.latency == 0.1
    a.record_success(0.2)
    assert abs(a.latency - 0.12) < 1e-9  # EWMA, alpha 0.2
    # A reload keeps the object (in-flight count included) and drops removed backends.
    pool.sync([Backend(name="a", url="http://127.0.0.1:1", weight=3)])
    assert pool.get("a") is a and a.weight == 3 and a.in_flight == 1 and pool.get("b") is None
    # A new address resets the history but not the in-flight count.
    pool.sync([Backend(name="a", url="http://127.0.0.1:9")])
    assert pool.get("a") is a and a.latency is None and a.in_flight == 1


def test_active_health_needs_two_failures_and_one_success() -> None:
    (state,) = _states("a")
    for _ in range(HEALTH_FAILURES_TO_DOWN - 1):
        assert not state.record_health(False)
    assert state.healthy
    assert state.record_health(False) and not state.healthy and not state.eligible(0.0)
    assert state.record_health(True) and state.healthy and state.eligible(0.0)
