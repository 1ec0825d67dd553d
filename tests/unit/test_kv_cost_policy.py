"""The cost model and the seed formula over token holdings (policy/kv_cost.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum_ingress.policy.kv_cost import (
    CandidateLoad,
    CostParams,
    DecayingDemand,
    Held,
    StartCommitments,
    choose_by_cost,
    choose_by_seed,
    load_bound,
    new_tokens,
)
from continuum_ingress.policy.kv_scoring import Weights
from continuum_ingress.policy.scorer import HoldingTier

# demands in these tests are a few thousand tokens: the tolerance floor is set to match
P = CostParams(
    prefill_tokens_per_second=10_000,
    per_request_s=0.002,
    storage_token_cost=0.25,
    epsilon=0.25,
    placement_tolerance_tokens=4000.0,
)


def loads(*in_flight: int, queued: tuple[int, ...] = ()) -> list[CandidateLoad]:
    q = queued or (0,) * len(in_flight)
    return [CandidateLoad(f"b{i}", n, q[i]) for i, n in enumerate(in_flight)]


def test_nothing_held_anywhere_is_placed_by_recent_demand() -> None:
    # A new prefix (a document or system prompt no backend holds) goes where the least new
    # work went recently, per unit of weight, not where its hash points.
    cands = [
        CandidateLoad("b0", 0, demand=9000),
        CandidateLoad("b1", 0, demand=4000),
        CandidateLoad("b2", 0, demand=7000),
    ]
    choice = choose_by_cost(1000, cands, {}, P)
    assert choice is not None and choice.backend == "b1" and choice.placed and choice.moved is None
    assert choice.tier is HoldingTier.NONE and choice.held_tokens == 0 and choice.new_tokens == 1000
    cands[0] = CandidateLoad("b0", 0, demand=9000, weight=4)  # 2,250 per unit of weight
    choice = choose_by_cost(1000, cands, {}, P)
    assert choice is not None and choice.backend == "b0"
    # over the load bound (without its slack) a backend takes no new prefix, however idle
    # (ε 1.0, 2 + 0 + 0 + 0 in flight: ceil(2 x 3 / 4) = 2, plus one request of slack)
    cands = [CandidateLoad("b0", 2, demand=0), *(CandidateLoad(f"b{i}", 0, demand=4000 + i) for i in (1, 2, 3))]
    assert load_bound(cands, 1.0, 1) == 3
    choice = choose_by_cost(1000, cands, {}, CostParams(epsilon=1.0, bound_slack=1))
    assert choice is not None and choice.backend == "b1"


def test_nothing_held_anywhere_declines_when_asked_to() -> None:
    # place_new_prefixes off, the caller's index read failed, or an empty prompt: the
    # configured strategy picks.
    assert choose_by_cost(1000, loads(0, 0), {}, replace(P, place_new_prefixes=False)) is None
    assert choose_by_cost(1000, loads(0, 0), {}, P, place_unheld=False) is None
    assert choose_by_cost(0, loads(0, 0), {}, P) is None
    assert choose_by_cost(1000, [], {}, P) is None
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


def test_demand_added_with_its_age_counts_what_is_left_of_it() -> None:
    # a decision replayed 20 s after it was made weighs what it would weigh had it been seen then
    then, late = DecayingDemand(half_life_s=10.0), DecayingDemand(half_life_s=10.0)
    then.add("a", 1000, now=0.0)
    then.add("a", 300, now=15.0)
    late.add("a", 300, now=20.0, age=5.0)
    late.add("a", 1000, now=20.0, age=20.0)
    assert late.value("a", 20.0) == pytest.approx(then.value("a", 20.0))
    assert late.value("a", 40.0) == pytest.approx(then.value("a", 40.0)) == pytest.approx((250 + 300 / 2**0.5) / 4)
    c = StartCommitments(half_life_s=20.0, demand_half_life_s=60.0)
    c.record("b0", 100, 40.0, start=True, age=40.0)
    c.record("b1", 1200, 40.0, start=False, age=0.0)
    # the start is a quarter of one start by now (two of its half-lives), booked at the 1,200
    # tokens per start the fleet saw since (a faded lone start counts as one)
    assert c.value("b0", 40.0) == pytest.approx(1200 / 4)


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
    # b1 holds 8,000 of 10,000 tokens but has 40,000 prefill tokens queued; b0 holds nothing.
    held = {"b1": Held(8000, 8000)}
    cands = loads(1, 1, queued=(0, 40_000))
    low = choose_by_cost(10_000, cands, held, replace(P, miss_penalty=3.0, placement_miss_penalty=3.0))
    assert low is not None and low.backend == "b0" and low.moved == "cost"  # 10,000 x 4 < 40,000 + 2,000 x 4
    high = choose_by_cost(10_000, cands, held, replace(P, miss_penalty=10.0, placement_miss_penalty=3.0))
    assert high is not None and high.backend == "b1" and high.moved is None  # 10,000 x 11 > 40,000 + 2,000 x 11
    # New work (a turn with a long paste: b0 holds 2,000 of its 10,000 tokens) that b0 took
    # 12,000 more tokens of recently than b1. Placement weighs (1 + placement penalty) x 2,000
    # against that, whatever the miss penalty.
    held = {"b0": Held(2000, 2000)}
    cands = [CandidateLoad("b0", 0, demand=22_000), CandidateLoad("b1", 0, demand=10_000)]
    for miss in (3.0, 10.0):
        spread = choose_by_cost(10_000, cands, held, replace(P, miss_penalty=miss, placement_miss_penalty=3.0))
        assert spread is not None and spread.backend == "b1"  # 22,000 + 4 x 8,000 > 10,000 + 4 x 10,000
    kept = choose_by_cost(10_000, cands, held, replace(P, placement_miss_penalty=10.0))
    assert kept is not None and kept.backend == "b0"  # 22,000 + 11 x 8,000 < 10,000 + 11 x 10,000


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


def test_a_start_stays_with_its_documents_holder_within_the_tolerance() -> None:
    # Every request opens a conversation on a 3,000-token document b0 holds. b0 took more new
    # work than the others recently; the mean is 10,000 tokens, so with a tolerance of 20% or
    # 1,000 tokens (whichever is more) b0 keeps the document's requests up to 12,000.
    tolerant = replace(P, placement_tolerance=0.2, placement_tolerance_tokens=1000.0)
    held = {"b0": Held(3000, 3000)}

    def cands(b0: float, mean: float = 10_000) -> list[CandidateLoad]:
        rest = (4 * mean - b0) / 3
        return [CandidateLoad("b0", 0, demand=b0), *(CandidateLoad(f"b{i}", 0, demand=rest) for i in (1, 2, 3))]

    kept = choose_by_cost(3030, cands(11_900), held, tolerant, start=True)
    assert kept is not None and kept.backend == "b0" and kept.placed and kept.moved is None
    assert kept.held_tokens == 3000 and kept.new_tokens == 30
    # Beyond it, a second copy goes to the least busy backend: its placement no longer weighs
    # the document b0 holds.
    copied = choose_by_cost(3030, cands(12_100), held, tolerant, start=True)
    assert copied is not None and copied.backend != "b0" and copied.moved == "placed" and copied.held_tokens == 0
    # At low demand the tokens decide: mean 1,000, b0 at 1,900 (190%) stays, at 2,100 not.
    kept = choose_by_cost(3030, cands(1_900, mean=1000), held, tolerant, start=True)
    assert kept is not None and kept.backend == "b0"
    copied = choose_by_cost(3030, cands(2_100, mean=1000), held, tolerant, start=True)
    assert copied is not None and copied.backend != "b0"
    # Without tolerance the holder keeps only what is at or below the mean.
    strict = replace(P, placement_tolerance=0.0, placement_tolerance_tokens=0.0)
    copied = choose_by_cost(3030, cands(10_500), held, strict, start=True)
    assert copied is not None and copied.backend != "b0"
    kept = choose_by_cost(3030, cands(10_000), held, strict, start=True)
    assert kept is not None and kept.backend == "b0"


def test_a_start_picks_the_least_busy_of_several_holders() -> None:
    held = {"b0": Held(3000, 3000), "b2": Held(3000, 3000), "b1": Held(500, 500)}
    cands = [
        CandidateLoad("b0", 0, demand=11_000),
        CandidateLoad("b1", 0, demand=1_000),
        CandidateLoad("b2", 0, demand=9_000),
        CandidateLoad("b3", 0, demand=15_000),
    ]
    choice = choose_by_cost(3030, cands, held, P, start=True)
    assert choice is not None and choice.backend == "b2" and choice.moved is None


def test_a_start_whose_holder_is_at_the_bound_goes_elsewhere() -> None:
    # b0 holds the document and is within the tolerance, but has 4 requests in flight: with
    # ε 1.0 and one request of slack the bound is ceil(2 x 6 / 4) + 1 = 4.
    held = {"b0": Held(3000, 3000)}
    cands = [CandidateLoad("b0", 4, demand=1000), *(CandidateLoad(f"b{i}", 0, demand=1000) for i in (1, 2, 3))]
    choice = choose_by_cost(3030, cands, held, CostParams(epsilon=1.0, bound_slack=1), start=True)
    assert choice is not None and choice.backend != "b0" and choice.moved == "bound"


def test_only_starts_use_the_tolerance() -> None:
    # The same request as a later turn (not a start) is decided by the cost model: b0 holds
    # nearly all of it and is kept however busy its recent demand, below the load bound.
    held = {"b0": Held(3000, 3000)}
    cands = [CandidateLoad("b0", 0, demand=90_000), *(CandidateLoad(f"b{i}", 0, demand=1000) for i in (1, 2, 3))]
    turn = choose_by_cost(3030, cands, held, P)
    assert turn is not None and turn.backend == "b0" and not turn.placed
    start = choose_by_cost(3030, cands, held, P, start=True)
    assert start is not None and start.backend != "b0"


def test_commitments_book_starts_at_what_starts_have_brought_since() -> None:
    c = StartCommitments(half_life_s=20.0, demand_half_life_s=60.0)
    # One-shot traffic (every request a start, nothing after them) books nothing.
    for i in range(8):
        c.record(f"b{i % 2}", 1300, 0.0, start=True)
    assert c.value("b0", 0.0) == 0.0 and c.value("b1", 0.0) == 0.0
    # Later turns brought 12,000 new tokens over those 8 starts: 1,500 per start, booked per
    # backend by its own starts (4 each), none where no conversation started.
    for _ in range(24):
        c.record("b2", 500, 0.0, start=False)
    assert c.per_start(0.0) == pytest.approx(1500)
    assert c.value("b0", 0.0) == pytest.approx(6000) == c.value("b0", 0.0, c.per_start(0.0))
    assert c.value("b1", 0.0) == pytest.approx(6000)
    assert c.value("b2", 0.0) == 0.0
    # A backend's starts fade with their half-life; the fleet's rate per start keeps.
    assert c.value("b0", 20.0) == pytest.approx(3000)
    c.clear()
    assert c.value("b0", 20.0) == 0.0


def test_a_start_goes_to_the_holder_with_fewer_conversations_just_started() -> None:
    # b0 and b2 hold the document and took the same demand, but b0 just took conversations
    # whose later turns are still to come: the next start goes to b2.
    held = {"b0": Held(3000, 3000), "b2": Held(3000, 3000)}
    cands = [
        CandidateLoad("b0", 0, demand=8000, committed=4000),
        CandidateLoad("b1", 0, demand=8000),
        CandidateLoad("b2", 0, demand=8000),
        CandidateLoad("b3", 0, demand=8000),
    ]
    for tie in range(4):
        choice = choose_by_cost(3030, cands, held, P, tie, start=True)
        assert choice is not None and choice.backend == "b2" and choice.moved is None


def test_commitments_do_not_copy_a_prefix() -> None:
    # Whether a start leaves its only holder is decided on recent demand alone: b0 is at the
    # mean however many conversations it just took, so the document is not copied.
    held = {"b0": Held(3000, 3000)}
    cands = [CandidateLoad("b0", 0, demand=5000, committed=50_000)]
    cands += [CandidateLoad(f"b{i}", 0, demand=5000) for i in (1, 2, 3)]
    choice = choose_by_cost(3030, cands, held, P, start=True)
    assert choice is not None and choice.backend == "b0"


def test_new_work_is_placed_counting_commitments() -> None:
    # A prompt nobody holds: b0 took the least demand but has conversations just started
    # whose later turns will bring more than the difference.
    cands = [
        CandidateLoad("b0", 0, demand=1000, committed=6000),
        CandidateLoad("b1", 0, demand=4000),
        CandidateLoad("b2", 0, demand=5000),
    ]
    choice = choose_by_cost(1000, cands, {}, P, start=True)
    assert choice is not None and choice.backend == "b1"
    without = [replace(c, committed=0.0) for c in cands]
    choice = choose_by_cost(1000, without, {}, P, start=True)
    assert choice is not None and choice.backend == "b0"
