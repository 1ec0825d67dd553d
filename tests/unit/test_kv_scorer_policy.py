"""The KV overlap scorer's pure parts and its prepare/score cache, against a real InMemoryKvIndex."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.kvindex import InMemoryKvIndex, KvHolder, KvIndexError
from continuum_ingress.kv.scorer import KvIndexUnavailable, KvOverlapScorer
from continuum_ingress.kv.speculative import SpeculativeEntries
from continuum_ingress.policy.kv_scoring import Holding, LoadSample, Weights, composite_scores, merge_provisional
from continuum_ingress.policy.scorer import HoldingTier, best_scored

W = Weights()


@dataclass
class Cand:
    name: str
    in_flight: int = 0
    success_rate: float = 1.0
    weight: int = 1
    latency: float | None = None


def loads(**in_flight: int) -> dict[str, LoadSample]:
    return {name: LoadSample(n, 1.0) for name, n in in_flight.items()}


def test_the_seed_formula_on_holders_only() -> None:
    holders = [Holding("a", 2048, Tier.GPU_HOT), Holding("b", 1024, Tier.GPU_HOT)]
    sample = {"a": LoadSample(2, 1.0), "b": LoadSample(0, 0.5), "c": LoadSample(4, 1.0)}
    scores = composite_scores(holders, sample, W)
    assert scores["a"] == (pytest.approx(0.6 * 1.0 + 0.3 * (1 - 2 / 4) + 0.1 * 1.0), HoldingTier.GPU_HOT)
    assert scores["b"] == (pytest.approx(0.6 * 0.5 + 0.3 * 1.0 + 0.1 * 0.5), HoldingTier.GPU_HOT)
    assert "c" not in scores  # an idle backend that holds nothing gets no score at all


def test_holders_below_min_overlap_score_zero() -> None:
    holders = [Holding("a", 4000, Tier.GPU_HOT), Holding("b", 1000, Tier.GPU_HOT)]
    scores = composite_scores(holders, loads(a=0, b=0), W)
    assert scores["b"] == (0.0, HoldingTier.GPU_HOT)  # 0.25 < 0.3
    looser = composite_scores(holders, loads(a=0, b=0), Weights(min_overlap=0.25))
    assert looser["b"][0] == pytest.approx(0.6 * 0.25 + 0.3 + 0.1)  # exactly at the threshold passes


def test_tier_multiplier_applies_before_the_threshold() -> None:
    warm = [Holding("a", 1000, Tier.STORAGE_WARM)]
    assert composite_scores(warm, loads(a=0), W)["a"] == (
        pytest.approx(0.6 * 0.6 + 0.3 + 0.1),
        HoldingTier.STORAGE_WARM,
    )
    cold = Weights(storage_tier=0.2)
    assert composite_scores(warm, loads(a=0), cold)["a"] == (0.0, HoldingTier.STORAGE_WARM)
    # gpu_tier_weight below the threshold: nothing can ever pass (config validate warns).
    assert composite_scores([Holding("a", 9, Tier.GPU_HOT)], loads(a=0), Weights(gpu_tier=0.2))["a"][0] == 0.0


def test_holders_that_are_not_candidates_are_skipped_but_still_normalise() -> None:
    holders = [Holding("gone", 4000, Tier.GPU_HOT), Holding("b", 1000, Tier.GPU_HOT)]
    assert composite_scores(holders, loads(b=0), W) == {"b": (0.0, HoldingTier.GPU_HOT)}


def test_provisional_rows_count_as_full_gpu_overlap_and_real_rows_win() -> None:
    rows = merge_provisional([Holding("a", 100, Tier.STORAGE_WARM)], ["a", "b"])
    assert rows == [Holding("a", 100, Tier.STORAGE_WARM), Holding("b", 0, Tier.GPU_HOT, speculative=True)]
    scores = composite_scores(rows, loads(a=0, b=1), W)
    assert scores["b"] == (pytest.approx(0.6 + 0.0 + 0.1), HoldingTier.GPU_HOT)
    assert scores["a"][0] == pytest.approx(0.6 * 0.6 + 0.3 + 0.1)
    only = composite_scores(merge_provisional([], ["b"]), loads(a=0, b=0), W)
    assert only == {"b": (pytest.approx(1.0), HoldingTier.GPU_HOT)}


def test_speculative_entries_expire_and_are_bounded() -> None:
    spec = SpeculativeEntries(2.0, max_prefixes=3)
    spec.record("p1", "a", now=0.0)
    spec.record("p1", "b", now=1.0)
    assert spec.backends("p1", now=1.5) == ("a", "b")
    assert spec.backends("p1", now=2.5) == ("b",)
    assert len(spec) == 1
    for i in range(2, 6):
        spec.record(f"p{i}", "a", now=2.6)
    assert len(spec) == 3 and spec.backends("p1", now=2.6) == ()  # least recently recorded went first
    spec.record("p9", "a", now=10.0)  # everything older expired: trimmed on write
    assert len(spec) == 1
    off = SpeculativeEntries(0.0)
    off.record("p", "a", now=0.0)
    assert not off.enabled and off.backends("p", now=0.0) == ()


class CountingIndex:
    """A KvIndex with a network index's shape (the scorer batches its reads), backed by an
    InMemoryKvIndex; counts the query_many calls."""

    def __init__(self) -> None:
        self.inner = InMemoryKvIndex()
        self.calls: list[list[str]] = []
        self.fail = False

    async def apply_batch(self, events: list[KvEvent]) -> None:
        await self.inner.apply_batch(events)

    async def query_many(self, prefix_hashes: Iterable[str]) -> dict[str, list[KvHolder]]:
        keys = list(prefix_hashes)
        self.calls.append(keys)
        if self.fail:
            raise KvIndexError("redis: ConnectionError")
        return await self.inner.query_many(keys)

    async def query_backends(self, prefix_hash: str) -> list[KvHolder]:
        return (await self.query_many([prefix_hash]))[prefix_hash]


def created(backend: str, key: bytes, tokens: int, seq: int, tier: Tier = Tier.GPU_HOT) -> KvEvent:
    return KvEvent(backend, 1, seq, 0.0, EventType.CREATED, key.hex(), tokens, tier)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def scorer_for(index: CountingIndex, clock: Clock, ttl: float = 2.0) -> KvOverlapScorer:
    return KvOverlapScorer(W, speculative=SpeculativeEntries(ttl), index=index, clock=clock)


P1, P2, P3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


async def test_prepare_reads_once_per_100ms_and_coalesces_prefixes() -> None:
    index, clock = CountingIndex(), Clock()
    await index.apply_batch([created("b", P1, 2048, 1), created("a", P1, 512, 2), created("c", P2, 64, 3)])
    scorer = scorer_for(index, clock)
    cands = [Cand("a"), Cand("b", in_flight=3), Cand("c")]
    await asyncio.gather(*(scorer.prepare(p, cands) for p in (P1, P2, P1, P3)))
    assert index.calls == [[P1.hex(), P2.hex(), P3.hex()]]  # one pipelined read, each prefix once
    assert scorer.score_with_tier(P1, "b") == (pytest.approx(0.6 + 0.0 + 0.1), HoldingTier.GPU_HOT)
    assert scorer.score(P1, "a") == 0.0  # 512 / 2048 < min_overlap
    assert scorer.score_with_tier(P3, "a") == (0.0, HoldingTier.NONE)
    best = best_scored(scorer, P1, cands)
    assert best is not None and best.backend == "b"
    assert best_scored(scorer, P3, cands) is None  # nobody holds it: the strategy decides
    clock.t += 0.05
    await scorer.prepare(P1, cands)
    assert len(index.calls) == 1  # served from the 100 ms cache
    clock.t += 0.06
    await scorer.prepare(P1, cands)
    assert index.calls[-1] == [P1.hex()]
    assert scorer.counters.lookups == 4 and scorer.counters.hits == 3


async def test_load_snapshot_is_kept_for_100ms() -> None:
    index, clock = CountingIndex(), Clock()
    await index.apply_batch([created("a", P1, 100, 1), created("b", P1, 100, 2)])
    scorer = scorer_for(index, clock)
    await scorer.prepare(P1, [Cand("a", in_flight=0), Cand("b", in_flight=4)])
    assert best_scored(scorer, P1, [Cand("a"), Cand("b")]).backend == "a"  # type: ignore[union-attr]
    clock.t += 0.05  # loads flipped, but the snapshot is 50 ms old: same answer
    await scorer.prepare(P1, [Cand("a", in_flight=9), Cand("b", in_flight=0)])
    assert scorer.score(P1, "a") > scorer.score(P1, "b")
    clock.t += 0.06
    await scorer.prepare(P1, [Cand("a", in_flight=9), Cand("b", in_flight=0)])
    assert scorer.score(P1, "b") > scorer.score(P1, "a")


async def test_speculative_entry_after_a_decision_then_the_real_row_takes_over() -> None:
    index, clock = CountingIndex(), Clock()
    scorer = scorer_for(index, clock)
    cands = [Cand("a"), Cand("b")]
    await scorer.prepare(P1, cands)
    assert best_scored(scorer, P1, cands) is None
    scorer.note_decision(P1, "b", "prefix_hash")  # the ring sent it to b
    await scorer.prepare(P1, cands)
    best = best_scored(scorer, P1, cands)
    assert best is not None and (best.backend, best.tier) == ("b", HoldingTier.GPU_HOT)
    scorer.note_decision(P1, "b", "kv_aware")
    assert scorer.counters.speculative_routes == 1
    clock.t += 0.2
    await index.apply_batch([created("a", P1, 800, 1)])  # the engine's event says a holds it
    await scorer.prepare(P1, cands)
    assert scorer.score(P1, "a") == scorer.score(P1, "b") == pytest.approx(1.0)  # b still provisional
    clock.t += 2.0  # b's provisional entry expired
    await scorer.prepare(P1, cands)
    assert scorer.score(P1, "b") == 0.0 and scorer.score(P1, "a") == pytest.approx(1.0)


async def test_disabled_speculation_records_nothing() -> None:
    index, clock = CountingIndex(), Clock()
    scorer = scorer_for(index, clock, ttl=0.0)
    scorer.note_decision(P1, "b", "prefix_hash")
    await scorer.prepare(P1, [Cand("a"), Cand("b")])
    assert best_scored(scorer, P1, [Cand("a"), Cand("b")]) is None


async def test_index_errors_raise_then_back_off_then_recover() -> None:
    index, clock = CountingIndex(), Clock()
    await index.apply_batch([created("a", P1, 100, 1)])
    scorer = scorer_for(index, clock)
    index.fail = True
    with pytest.raises(KvIndexError):
        await scorer.prepare(P1, [Cand("a")])
    with pytest.raises(KvIndexUnavailable):  # within the back-off: no read at all
        await scorer.prepare(P2, [Cand("a")])
    assert len(index.calls) == 1 and scorer.counters.errors == 1
    index.fail = False
    clock.t += 1.0
    await scorer.prepare(P1, [Cand("a")])
    assert scorer.score(P1, "a") == pytest.approx(1.0)


async def test_a_waiter_that_gives_up_does_not_cancel_the_shared_read() -> None:
    index, clock = CountingIndex(), Clock()
    await index.apply_batch([created("a", P1, 100, 1)])
    gate = asyncio.Event()
    original = index.query_many

    async def slow(prefixes: Iterable[str]) -> dict[str, list[KvHolder]]:
        await gate.wait()
        return await original(prefixes)

    index.query_many = slow  # type: ignore[method-assign]
    scorer = scorer_for(index, clock)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await scorer.prepare(P1, [Cand("a")])
    gate.set()
    await scorer.prepare(P1, [Cand("a")])  # the first read finishes and fills the cache
    assert scorer.score(P1, "a") == pytest.approx(1.0)


async def test_the_embedded_memory_index_is_read_synchronously() -> None:
    index, clock = InMemoryKvIndex(), Clock()
    await index.apply_batch([created("a", P1, 100, 1)])
    scorer = KvOverlapScorer(W, speculative=SpeculativeEntries(2.0), index=index, clock=clock)
    step = scorer.prepare(P1, [Cand("a")])
    with pytest.raises(StopIteration):  # completes without ever suspending
        step.send(None)
    assert scorer.score(P1, "a") == pytest.approx(1.0) and scorer.counters.lookups == 1
