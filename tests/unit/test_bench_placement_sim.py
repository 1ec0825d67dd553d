"""The offline placement replay (bench/continuum_bench/fleet/placement_sim.py): the router's own
cost model against a model fleet, on the benchmark's workloads."""

from __future__ import annotations

import pytest

from continuum_bench.fleet import placement_sim as sim
from continuum_bench.fleet.tokens import Texts, make_codec
from continuum_bench.fleet.trace import DEFAULT_TRACE
from continuum_common.config.kv_index import CostModel


@pytest.fixture(scope="module")
def texts() -> Texts:
    return Texts(make_codec("builtin"))


def test_the_cache_is_lru_over_leading_blocks() -> None:
    cache = sim.Cache(3)
    cache.touch(["a", "b", "c"])
    assert cache.held(["a", "b", "x"]) == 2 and cache.held(["x", "a"]) == 0
    cache.touch(["a", "d"])  # "b" is the least recently used
    assert cache.held(["a"]) == 1 and cache.held(["b"]) == 0 and cache.held(["c", "d"]) == 2


def test_shared_prompt_requests_share_their_documents_blocks(texts: Texts) -> None:
    requests, follow = sim.shared_prompt(1, texts)
    assert len(requests) == 400 and not follow and all(r.start for r in requests)
    by_doc: dict[str, list[sim.Request]] = {}
    for r in requests:
        by_doc.setdefault(r.key, []).append(r)
    assert 1 < len(by_doc) <= 16
    one, other = next(rs for rs in by_doc.values() if len(rs) > 1)[:2]
    # the ~3,000-token document is common; the question is not
    assert one.blocks[:180] == other.blocks[:180] and one.blocks != other.blocks


def test_sticky_never_copies_and_keeps_every_hit_while_everything_fits(texts: Texts) -> None:
    requests, _ = sim.shared_prompt(1, texts)
    out = sim.replay(requests, [], sim.sticky_policy, block=16, capacity=1500, cost=CostModel())
    assert out.hit_ideal == pytest.approx(1.0)
    assert out.moves == {"cost": 0, "bound": 0, "placed": 0}
    assert out.imbalance > 1.0


def test_the_cost_model_balances_and_counts_what_it_moves(texts: Texts) -> None:
    requests, _ = sim.shared_prompt(1, texts)
    out = sim.replay(requests, [], sim.make_policy("default"), block=16, capacity=1500, cost=CostModel())
    assert 0.95 < out.hit_ideal <= 1.0 and out.imbalance < 1.3
    # with no tolerance at all every doc whose holder runs ahead of the mean is copied
    strict = "placement_tolerance=0,placement_tolerance_tokens=0"
    tight = sim.replay(requests, [], sim.make_policy(strict), block=16, capacity=1500, cost=CostModel())
    assert tight.moves["placed"] > out.moves["placed"] and tight.hit_ideal < out.hit_ideal


def test_demand_counted_by_requests_places_documents_by_where_requests_go(texts: Texts) -> None:
    requests, _ = sim.shared_prompt(1, texts)
    # The defaults count each request as 3,000 tokens of demand: a new document goes where the
    # documents already placed draw the fewest requests, and no popular one needs a copy later.
    # Counted by prefill (256 per request), documents spread by number and the balance costs
    # copies, each a full prefill of a shared document.
    by_requests = sim.replay(requests, [], sim.make_policy("default"), block=16, capacity=1500, cost=CostModel())
    by_prefill = "placement_request_tokens=256,placement_tolerance_tokens=4000"
    cost = CostModel(placement_request_tokens=256, placement_tolerance_tokens=4000)
    old = sim.replay(requests, [], sim.make_policy(by_prefill), block=16, capacity=1500, cost=cost)
    assert by_requests.imbalance < 1.3 and old.imbalance < 1.3
    assert by_requests.hit_ideal > old.hit_ideal
    assert by_requests.moves["placed"] < old.moves["placed"]


def test_multi_turn_conversations_grow_and_their_answers_are_cached(texts: Texts) -> None:
    _, follow = sim.multi_turn(1, texts)
    assert len(follow) == 64
    first = follow[0].next(follow[0].start)
    assert first is not None and first.start and first.after
    second = follow[0].next(first.at + 1)
    assert second is not None and not second.start
    # the next turn's prompt starts with the first prompt and the answer's full blocks
    assert second.blocks[: len(first.blocks) + len(first.after) - 1] == (first.blocks + first.after)[:-1]


def test_the_command_prints_one_row_per_workload_and_variant(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workloads", "shared-prompt,trace", "--seeds", "1", "--variant", "default", "--variant", "sticky"]
    assert sim.main([*argv, "--trace", str(DEFAULT_TRACE), "--trace-duration", "60"]) == 0
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| shared") or line.startswith("| trace")
    ]
    assert [r.split(" | ")[0:2] for r in rows] == [
        ["| shared-prompt", "default"], ["| shared-prompt", "sticky"], ["| trace", "default"], ["| trace", "sticky"]
    ]  # fmt: skip


def test_a_timing_spread_replays_each_seed_three_times(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workloads", "multi-turn", "--seeds", "1", "--variant", "default", "--timing-spread", "0.5"]
    assert sim.main(argv) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| multi-turn"))
    runs = row.split(" | ")[4].rstrip(" |").split()
    assert len(runs) == 3 and " of 3 " in row


def test_the_model_fleet_runs_at_the_speed_asked(texts: Texts) -> None:
    # Twice the decode time per token keeps twice as many requests in flight: with a load bound
    # of 2 per engine, the slow fleet has to move requests the fast one does not.
    def moves(decode: float) -> int:
        requests, _ = sim.shared_prompt(1, texts)
        cost = CostModel(load_factor_epsilon=0.01, load_bound_slack=0)
        out = sim.replay(requests, [], sim.make_policy("load_factor_epsilon=0.01,load_bound_slack=0"),
                         block=sim.CHAT_BLOCK, capacity=sim.CHAT_CAPACITY, cost=cost, speed=(1.0, decode))  # fmt: skip
        return out.moves["bound"]

    assert moves(4.0) > moves(1.0)


def test_unknown_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        sim.make_policy("placement_tolerance=-1")
    with pytest.raises(SystemExit):
        sim.make_policy("sticki")
    with pytest.raises(SystemExit):
        sim.main(["--workloads", "trace"])
    assert sim.parse_variant("demand-only,load_bound_slack=1") == ("demand-only", {"load_bound_slack": 1})
    assert sim.parse_variant("place_new_prefixes=false") == ("default", {"place_new_prefixes": False})
