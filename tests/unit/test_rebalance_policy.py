"""How many idle connections a worker hands to which sibling (policy/rebalance.py)."""

from __future__ import annotations

import math
import random

from continuum_ingress.policy.rebalance import Move, plan_moves


def test_the_busier_of_two_workers_gives_the_difference_to_the_fair_share() -> None:
    assert plan_moves(44, {1: 20}) == [Move(1, 12)]
    assert plan_moves(6, {1: 2}) == [Move(1, 2)]
    assert plan_moves(5, {1: 3}) == [Move(1, 1)]


def test_a_worker_at_or_under_the_fair_share_gives_nothing() -> None:
    assert plan_moves(32, {1: 32}) == []
    assert plan_moves(5, {1: 4}) == []  # 9 connections: 5/4 is as even as it gets
    assert plan_moves(20, {1: 44}) == []
    assert plan_moves(0, {1: 8}) == []
    assert plan_moves(8, {}) == []  # no sibling has reported


def test_the_emptiest_siblings_are_filled_first_and_none_beyond_the_floor_of_the_share() -> None:
    # 40 connections over 4 workers: 10 each
    assert plan_moves(25, {1: 9, 2: 0, 3: 6}) == [Move(2, 10), Move(3, 4), Move(1, 1)]
    # 11 connections over 3 workers, fair 3.67: the giver keeps 4 and fills the others up to 4
    assert plan_moves(9, {1: 1, 2: 1}) == [Move(1, 3), Move(2, 2)]


def test_tolerance_and_limit() -> None:
    assert plan_moves(5, {1: 3}, tolerance=1) == []
    assert plan_moves(6, {1: 2}, tolerance=1) == [Move(1, 2)]
    assert plan_moves(100, {1: 0}, limit=16) == [Move(1, 16)]


def test_moves_converge_and_never_go_back_and_forth() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(2, 6)
        counts = [rng.randint(0, 50) for _ in range(n)]
        total = sum(counts)
        for _round in range(20):
            planned = {i: plan_moves(counts[i], {j: c for j, c in enumerate(counts) if j != i}) for i in range(n)}
            givers = {i for i, moves in planned.items() if moves}
            takers = {m.to for moves in planned.values() for m in moves}
            assert not givers & takers  # nobody gives and takes in the same round
            if not givers:
                break
            i = min(givers)  # one worker acts at a time, as each worker plans on its own clock
            for move in planned[i]:
                counts[i] -= move.count
                counts[move.to] += move.count
        assert sum(counts) == total
        assert max(counts) <= math.ceil(total / n)
        assert not any(plan_moves(counts[i], {j: c for j, c in enumerate(counts) if j != i}) for i in range(n))
