"""How many client connections one worker of a `serve` hands to which sibling (pure; the I/O
is continuum_ingress.rebalancer and adapters/handoff.py).

The kernel spreads new connections over the workers by a hash of their addresses
(SO_REUSEPORT) and never moves them again. With many short connections that evens out; with a
few long-lived keep-alive connections (a load balancer's upstream pool, an SDK client's pool)
it does not: 64 connections split 44/20 between two workers, and 8 split 6/2, which leaves one
core idle while the other queues. Each worker therefore compares its open connections with the
counts its siblings last reported and hands idle keep-alive connections to the ones below the
fair share.

Only a worker above `ceil(fair) + tolerance` gives, it keeps `ceil(fair)`, and it gives a sibling
at most what brings that sibling up to `ceil(fair)`, so a receiver never ends where it would
give, and two workers never hand the same connections back and forth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0  # connections above ceil(fair) a worker keeps before it gives


@dataclass(frozen=True, slots=True)
class Move:
    """Hand `count` connections to the worker with index `to`."""

    to: int
    count: int


def plan_moves(
    mine: int, siblings: Mapping[int, int], *, tolerance: int = DEFAULT_TOLERANCE, limit: int = 64
) -> list[Move]:
    """The moves that bring this worker (`mine` open connections) towards the fair share of
    every worker's connections, given each sibling's last reported count. Siblings with no
    report are not in `siblings` and neither give nor take. At most `limit` connections move
    in one plan (the next plan, one interval later, sees the result)."""
    if not siblings or mine <= 0:
        return []
    total = mine + sum(siblings.values())
    fair = total / (len(siblings) + 1)
    excess = mine - math.ceil(fair)
    if excess <= tolerance:
        return []
    budget = min(excess, limit)
    moves: list[Move] = []
    for index, count in sorted(siblings.items(), key=lambda item: (item[1], item[0])):
        room = math.ceil(fair) - count
        if room <= 0 or budget <= 0:
            break
        give = min(room, budget)
        moves.append(Move(index, give))
        budget -= give
    return moves
