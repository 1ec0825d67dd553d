"""The cost model and the seed formula over token holdings (policy/kv_cost.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum_ingress.policy.kv_cost import (
    CandidateLoad,
    CostParams,
    DecayingDemand,
    Held,
    choose_by_cost,
    choose_by_seed,
    load_bound,
    new_tokens,
)
from continuum_ingress.policy.kv_scoring import Weights
from continuum_ingress.policy.scorer import HoldingTier

P = CostParams(prefill_tokens_per_second=10_000, per_request_s=0.002, storage_token_cost=0.25, epsilon=0.25)


def loads(*in_flight: int, queued: tuple[int, ...] = ()) -> list[CandidateLoad]:
    q = queued or (0,) * len(in_flight)
    return [CandidateLoad(f"b{i}", n, q[i]) for i, n in enumerate(in_flight)]


def test_nothing_held_anywhere_declines() -> None:
    assert choose_by_cost(1000, loads(0, 0), {}, P) is None
    assert choose_by_seed(1000, loads(0, 0), {}, Weights()) is None


def test_longest_prefix_wins_at_equal_load() -> None:
    held = {"b0": Held(200, 200), "b1": Held(900, 900)}
    choice = choose_by_cost(1000, loads(1, 1), held, P)
    assert choice is not None and choice.backend == "b1"
    assert choice.held_tokens == 900 and choice.new_tokens == 100 and choice.tier is HoldingTier.GPU_HOT
    assert choice.overlap == pytest.approx(0.9)
    assert choice.moved is None


def test_holding_more_than_the_prompt_is_no_deeper() -> None:
    # both hold the whole prompt (b1 also longer continuations): the queue decides, not a move
    held = {"b0": Held(1000, 1000), "b1": Held(1600, 1600)}
    choice = choose_by_cost(1000, loads(1, 1, queued=(0, 5000)), held, P)
    assert choice is not None and choice.backend == "b0" and choice.moved is None


def test_a_long_prefill_queue_outweighs_a_small_cache_advantage() -> None:
    # b1 holds 300 more tokens but has 12,000 queued prefill tokens ahead of the request: more
    # than the 300 tokens charged with the miss penalty (300 * 31 = 9,300).
    held = {"b0": Held(500, 500), "b1": Held(800, 800)}
    choice = choose_by_cost(1000, loads(1, 1, queued=(0, 12_000)), held, P)
    assert choice is not None and choice.backend == "b0" and choice.moved == "cost"
    # a queue shorter than that keeps the request with the deeper holder
    choice = choose_by_cost(1000, loads(1, 1, queued=(0, 9_000)), held, P)
    assert choice is not None and choice.backend == "b1" and choice.moved is None


def test_the_load_bound_caps_affinity() -> None:
    # 4 candidates, 8 in flight: bound = ceil(1.25 * 9 / 4) = 3; b0 holds everything but has 5.
    held = {"b0": Held(10_000, 10_000)}
    cands = loads(5, 1, 1, 1)
    assert load_bound(cands, 0.25) == 3
    choice = choose_by_cost(10_000, cands, held, P)
    assert choice is not None and choice.backend != "b0" and choice.moved == "bound"


def test_storage_tokens_count_partly() -> None:
    assert new_tokens(1000, Held(0, 800), P) == pytest.approx(1000 - 800 * 0.75)
    held = {"b0": Held(0, 800), "b1": Held(500, 500)}
    choice = choose_by_cost(1000, loads(0, 0), held, P)
    # b0: 1000 - 600 = 400 new tokens; b1: 500 new tokens
    assert choice is not None and choice.backend == "b0" and choice.tier is HoldingTier.STORAGE_WARM


def test_ties_are_spread_by_the_tie_key() -> None:
    held = {f"b{i}": Held(100, 100) for i in range(4)}
    chosen = {choose_by_cost(1000, loads(0, 0, 0, 0), held, P, tie_key=k).backend for k in range(8)}  # type: ignore[union-attr]
    assert chosen == {"b0", "b1", "b2", "b3"}


@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=8),
    st.lists(st.integers(0, 5000), min_size=8, max_size=8),
    st.integers(1, 20_000),
)
def test_never_beyond_the_bound_while_someone_is_under_it(
    in_flight: list[int], held_tokens: list[int], prompt: int
) -> None:
    cands = loads(*in_flight)
    held = {c.name: Held(h, h) for c, h in zip(cands, held_tokens, strict=False)}
    choice = choose_by_cost(prompt, cands, held, P)
    if choice is None:
        assert all(h == 0 for h in held_tokens[: len(cands)])
        return
    bound = load_bound(cands, P.epsilon)
    picked = next(c for c in cands if c.name == choice.backend)
    assert picked.in_flight < bound or all(c.in_flight >= bound for c in cands)


def test_seed_formula_on_holdings() -> None:
    w = Weights()
    held = {"b0": Held(100, 100), "b1": Held(1000, 1000)}
    choice = choose_by_seed(1000, loads(0, 0), held, w)
    assert choice is not None and choice.backend == "b1"
    # b0's overlap is 0.1 < min_overlap 0.3: only holders above the threshold score
    assert choice.score == pytest.approx(0.6 * 1.0 + 0.3 * 1.0 + 0.1 * 1.0)
    # a holder always wins over load under the seed's weights, however loaded it is
    busy = choose_by_seed(1000, loads(0, 50), held, w)
    assert busy is not None and busy.backend == "b1"


def test_new_work_is_placed_by_recent_demand_per_weight() -> None:
    # Only b0 holds the shared head (10% of the prompt): below the affinity threshold.
    held = {"b0": Held(100, 100)}
    cands = [
        CandidateLoad("b0", 0, demand=5000),
        CandidateLoad("b1", 0, demand=3000),
        CandidateLoad("b2", 0, demand=900),
    ]
    choice = choose_by_cost(1000, cands, held, P)
    assert choice is not None and choice.placed and choice.backend == "b2" and choice.tier is HoldingTier.NONE
    # weight 4 = a backend four times the size: its demand counts a quarter
    cands[0] = CandidateLoad("b0", 0, demand=3000, weight=4)
    choice = choose_by_cost(1000, cands, held, P)
    assert choice is not None and choice.backend == "b0" and choice.tier is HoldingTier.GPU_HOT
    # above the threshold the cache decides, not the demand
    held = {"b0": Held(400, 400)}
    choice = choose_by_cost(1000, cands, held, P)
    assert choice is not None and not choice.placed and choice.backend == "b0"


def test_placement_counts_what_a_candidate_holds() -> None:
    # A turn with a long paste: b0 holds 2,500 tokens of the conversation (25%, below the
    # affinity threshold), b1 and b2 only the shared head. Demands within one prompt of each
    # other: the history decides.
    held = {"b0": Held(2500, 2500), "b1": Held(500, 500), "b2": Held(500, 500)}
    cands = [
        CandidateLoad("b0", 0, demand=12_000),
        CandidateLoad("b1", 0, demand=6_000),
        CandidateLoad("b2", 0, demand=9_000),
    ]
    choice = choose_by_cost(10_000, cands, held, P)
    assert choice is not None and choice.placed and choice.backend == "b0" and choice.held_tokens == 2500
    assert choice.moved is None
    # ...unless home received far more new work recently than the history is worth
    cands[0] = CandidateLoad("b0", 0, demand=40_000)
    choice = choose_by_cost(10_000, cands, held, P)
    assert choice is not None and choice.placed and choice.backend == "b1" and choice.moved == "placed"


def test_a_conversation_start_is_placed_whatever_it_holds() -> None:
    # b0 holds the shared system prompt: 1,000 of the first turn's 1,080 tokens
    held = {"b0": Held(1000, 1000)}
    cands = [
        CandidateLoad("b0", 0, demand=20_000),
        CandidateLoad("b1", 0, demand=10_000),
        CandidateLoad("b2", 0, demand=12_000),
    ]
    followed = choose_by_cost(1080, cands, held, P)
    assert followed is not None and followed.backend == "b0" and not followed.placed
    # as the start of a conversation it goes where the least new work went, since b0's extra
    # demand outweighs the system prompt it would recompute elsewhere (with the miss penalty)
    started = choose_by_cost(1080, cands, held, P, start=True)
    assert started is not None and started.placed and started.backend == "b1" and started.moved == "placed"
    # demands within that margin: the held system prompt still decides
    cands[0] = CandidateLoad("b0", 0, demand=12_000)
    started = choose_by_cost(1080, cands, held, P, start=True)
    assert started is not None and started.placed and started.backend == "b0" and started.moved is None


def test_placement_respects_the_load_bound() -> None:
    held = {"b0": Held(10, 10)}
    cands = [CandidateLoad("b0", 6, demand=0), CandidateLoad("b1", 1, demand=9000), CandidateLoad("b2", 1, demand=9000)]
    choice = choose_by_cost(1000, cands, held, P)
    assert choice is not None and choice.placed and choice.backend != "b0"


def test_decaying_demand() -> None:
    demand = DecayingDemand(half_life_s=10.0)
    demand.add("a", 1000, now=0.0)
    assert demand.value("a", 10.0) == pytest.approx(500)
    demand.add("a", 500, now=10.0)
    assert demand.value("a", 20.0) == pytest.approx(500)
    assert demand.value("b", 20.0) == 0.0
    demand.clear()
    assert demand.value("a", 20.0) == 0.0


def test_the_bound_slack_keeps_a_home_that_is_one_request_busier() -> None:
    # b0 holds the conversation and has 2 requests in flight, the others none: with ε 1.0 the
    # bound is ceil(2 · 3 / 4) = 2, so b0 is full and the turn loses its history
    params = CostParams(epsilon=1.0)
    cands = [CandidateLoad("b0", 2), CandidateLoad("b1", 0), CandidateLoad("b2", 0), CandidateLoad("b3", 0)]
    held = {"b0": Held(5000, 5000)}
    assert load_bound(cands, 1.0) == 2
    moved = choose_by_cost(5200, cands, held, params)
    assert moved is not None and moved.backend != "b0" and moved.moved == "bound"
    # one request of slack keeps it home
    kept = choose_by_cost(5200, cands, held, CostParams(epsilon=1.0, bound_slack=1))
    assert kept is not None and kept.backend == "b0" and kept.moved is None
    # ...but not beyond the slack
    cands[0] = CandidateLoad("b0", 3)
    assert load_bound(cands, 1.0, 1) == 3
    moved = choose_by_cost(5200, cands, held, CostParams(epsilon=1.0, bound_slack=1))
    assert moved is not None and moved.backend != "b0"


def test_the_miss_penalty_and_the_placement_penalty_are_separate() -> None:
    """The miss penalty decides when a queue moves a conversation off its home; the placement
    penalty how strongly new work follows what a candidate holds. One does not move the other."""
    from dataclasses import replace

    # b1 holds 8,000 of 10,000 tokens but has 40,000 prefill tokens queued; b0 holds nothing.
    held = {"b1": Held(8000, 8000)}
    cands = loads(1, 1, queued=(0, 40_000))
    low = choose_by_cost(10_000, cands, held, replace(P, miss_penalty=3.0, placement_miss_penalty=3.0))
    assert low is not None and low.backend == "b0" and low.moved == "cost"  # 10,000 x 4 < 40,000 + 2,000 x 4
    high = choose_by_cost(10_000, cands, held, replace(P, miss_penalty=10.0, placement_miss_penalty=3.0))
    assert high is not None and high.backend == "b1" and high.moved is None  # 10,000 x 11 > 40,000 + 2,000 x 11
    # A conversation start: b0 holds its 1,000-token system prompt but took 6,000 more tokens
    # of new work recently than b1. Placement weighs (1 + placement penalty) x 1,000 against it.
    held = {"b0": Held(1000, 1000)}
    cands = [CandidateLoad("b0", 0, demand=16_000), CandidateLoad("b1", 0, demand=10_000)]
    for miss in (3.0, 10.0):
        spread = choose_by_cost(
            1080, cands, held, replace(P, miss_penalty=miss, placement_miss_penalty=3.0), start=True
        )
        assert spread is not None and spread.backend == "b1"  # 16,000 + 4 x 80 > 10,000 + 4 x 1,080
    kept = choose_by_cost(1080, cands, held, replace(P, placement_miss_penalty=10.0), start=True)
    assert kept is not None and kept.backend == "b0"  # 16,000 + 11 x 80 < 10,000 + 11 x 1,080


def test_new_work_leaves_the_slack_to_conversations_already_home() -> None:
    # ε 1.0, slack 1, 4 candidates with 1 + 0 + 0 + 0 in flight: the bound is ceil(2 · 2 / 4) +
    # 1 = 2. A new conversation holds its 1,000-token system prompt on b0 (a fifth of its
    # prompt), and b0 took the least new work recently, so placement alone would put it there;
    # b0 is at the bound without the slack (1) and it goes elsewhere, leaving b0's last slot to
    # the next turn of a conversation b0 already serves.
    params = CostParams(epsilon=1.0, bound_slack=1)
    cands = [CandidateLoad("b0", 1, demand=0), *(CandidateLoad(f"b{i}", 0, demand=5000) for i in (1, 2, 3))]
    system = {"b0": Held(1000, 1000)}
    assert load_bound(cands, 1.0, 1) == 2
    placed = choose_by_cost(5000, cands, system, params, start=True)
    assert placed is not None and placed.placed and placed.backend != "b0"
    # A turn that holds its history is not new work: it uses the slack and stays home.
    kept = choose_by_cost(9500, cands, {"b0": Held(9000, 9000)}, params)
    assert kept is not None and kept.backend == "b0" and not kept.placed
    # A conversation start that holds most of its prompt (a long shared document) has cache
    # affinity: it is placed, and may use the slack.
    document = choose_by_cost(1100, cands, system, params, start=True)
    assert document is not None and document.placed and document.backend == "b0"
    # Under the strict bound, the new conversation is placed on b0 as before.
    cands[0] = CandidateLoad("b0", 0, demand=0)
    placed = choose_by_cost(5000, cands, system, params, start=True)
    assert placed is not None and placed.placed and placed.backend == "b0"
