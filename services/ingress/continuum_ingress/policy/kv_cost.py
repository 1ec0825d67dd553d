"""Which backend a request should go to, given how much of its prompt each backend already holds
(pure; docs/kv-scorer.md, "The cost model").

Input per candidate: the prompt tokens it holds as a leading prefix (`gpu_tokens` in GPU memory,
`any_tokens` in GPU or a storage tier), its in-flight requests, and the uncached prompt tokens of
requests this router sent it that have not produced a first byte yet (`queued_tokens`).

`cost` (the default) estimates each candidate's time to first token:

    new_tokens = prompt − gpu_tokens − (any_tokens − gpu_tokens) · (1 − storage_token_cost)
    cost       = (queued_tokens + new_tokens · (1 + miss_penalty)) / prefill_tokens_per_second
                 + in_flight · per_request

(the estimated time to first token, with each uncached token also charged `miss_penalty` for
the second copy it writes and the history the conversation leaves behind) and takes the
smallest, among the candidates under the CHWBL load bound
`ceil((1 + ε) · (total in flight + 1) / candidates) + slack`: cache affinity alone never pushes a
backend beyond it. Exact ties go to a backend chosen by `tie_key` (a hash of the request's prefix), so
equal candidates share new conversations evenly and deterministically.

A request whose best candidate holds less than `affinity_threshold` of its prompt is new work
(a new conversation that shares only a system prompt with others), and so is the first turn of a
chat conversation (`start`: no earlier answer in it), whatever it holds, since its backend is
where every later turn will go: it is *placed* instead, on the eligible candidate that was given
the least new prompt recently (`demand`, decayed, per unit of weight, plus `committed`: what
the conversations started there recently are still expected to bring, StartCommitments) plus
what it would prefill there (charged `placement_miss_penalty` like a miss), so conversations
spread over every backend's cache rather than piling onto whoever holds their shared head. Work that holds less
than `affinity_threshold` of its prompt anywhere is placed under the bound without its slack,
which stays free for requests with cache affinity (the turns of conversations a backend
already serves). A start that holds most of its prompt (a long shared document) stays with the
least busy of its deepest holders (by demand and commitments) while that holder's demand is
within `placement_tolerance` of the mean (or `placement_tolerance_tokens` above it); beyond that
its prefix is copied to another backend. A prompt nobody holds any of is placed the same way (`place_new_prefixes`).

`seed` is the seed's composite score over the same holdings (policy/kv_scoring.py's formula with
raw_overlap = tokens held / most held by any candidate), deciding only above 0.3.

Both return None when they decline: `seed` when no candidate holds any of the prompt, `cost`
only when asked to (`place_unheld`, `place_new_prefixes`); the configured strategy then picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from continuum_common.config.kv_index import CostModel
from continuum_ingress.policy.kv_scoring import Weights
from continuum_ingress.policy.scorer import SCORER_THRESHOLD, HoldingTier


@dataclass(frozen=True, slots=True)
class CandidateLoad:
    name: str
    in_flight: int
    queued_tokens: int = 0
    success_rate: float = 1.0
    demand: float = 0.0  # new prompt tokens sent here recently (decayed)
    weight: int = 1
    committed: float = 0.0  # later demand still expected from conversations started here


@dataclass(frozen=True, slots=True)
class Held:
    """What one candidate holds of the request's prompt, in tokens (leading prefix)."""

    gpu_tokens: int = 0
    any_tokens: int = 0
    speculative: bool = False  # known only from this router's own recent decisions

    @property
    def tier(self) -> HoldingTier:
        if self.gpu_tokens > 0:
            return HoldingTier.GPU_HOT
        if self.any_tokens > 0:
            return HoldingTier.STORAGE_WARM
        return HoldingTier.NONE


NOTHING = Held()

# Why a request went to a candidate holding less of its prompt than the deepest holder.
Moved = Literal["cost", "bound", "placed"]


@dataclass(frozen=True, slots=True)
class CostParams:
    prefill_tokens_per_second: float = 10_000.0
    per_request_s: float = 0.002
    storage_token_cost: float = 0.25
    epsilon: float = 1.0
    affinity_threshold: float = 0.3
    miss_penalty: float = 30.0
    bound_slack: int = 0
    placement_miss_penalty: float = 3.0
    placement_tolerance: float = 0.2
    placement_tolerance_tokens: float = 80_000.0
    place_new_prefixes: bool = True

    @classmethod
    def from_config(cls, cfg: CostModel, default_epsilon: float) -> CostParams:
        return cls(
            prefill_tokens_per_second=cfg.prefill_tokens_per_second,
            per_request_s=cfg.per_request_ms / 1000.0,
            storage_token_cost=cfg.storage_token_cost,
            epsilon=cfg.load_factor_epsilon if cfg.load_factor_epsilon is not None else default_epsilon,
            affinity_threshold=cfg.affinity_threshold,
            miss_penalty=cfg.miss_penalty,
            bound_slack=cfg.load_bound_slack,
            placement_miss_penalty=cfg.placement_miss_penalty,
            placement_tolerance=cfg.placement_tolerance,
            placement_tolerance_tokens=cfg.placement_tolerance_tokens,
            place_new_prefixes=cfg.place_new_prefixes,
        )


@dataclass(frozen=True, slots=True)
class KvChoice:
    backend: str
    score: float  # cost: estimated TTFT in seconds; seed: the composite score
    tier: HoldingTier
    held_tokens: int  # tokens of the prompt the chosen backend holds (GPU or storage)
    new_tokens: int  # tokens it will have to prefill
    speculative: bool
    # What the overlap histogram records: the fraction of the prompt held (cost), or the
    # composite score (seed).
    overlap: float = 0.0
    placed: bool = False  # new work placed for balance, not for its cached prefix
    # Why the chosen candidate holds less of the prompt than the deepest holder: "bound" (every
    # deepest holder was at the load bound), "cost" (a queue outweighed the cached prefix) or
    # "placed" (new work spread for balance); None when the choice holds the most.
    moved: Moved | None = None


def _moved(
    prompt_tokens: int,
    chosen: str,
    candidates: Sequence[CandidateLoad],
    eligible: Sequence[CandidateLoad],
    held: dict[str, Held],
    *,
    reason: Moved,
) -> Moved | None:
    """Why `chosen` is not a deepest holder of the prompt, if it is not (holdings beyond the
    prompt count as the whole prompt: two candidates holding all of it are equally deep)."""
    depth = {c.name: min(held.get(c.name, NOTHING).any_tokens, prompt_tokens) for c in candidates}
    deepest = max(depth.values())
    if depth[chosen] >= deepest:
        return None
    if any(depth[c.name] >= deepest for c in eligible):
        return reason
    return "bound"


def new_tokens(prompt_tokens: int, held: Held, params: CostParams) -> float:
    gpu = min(held.gpu_tokens, prompt_tokens)
    warm = max(0, min(held.any_tokens, prompt_tokens) - gpu)
    return max(0.0, prompt_tokens - gpu - warm * (1.0 - params.storage_token_cost))


def load_bound(candidates: Sequence[CandidateLoad], epsilon: float, slack: int = 0) -> int:
    """CHWBL's `ceil((1 + ε) · (total + 1) / n)`, plus `slack` requests: with a few requests in
    flight the rounding alone makes the bound 2 or 3, and a conversation whose home is one
    request busier than the rest would be moved for a difference the engine barely feels."""
    total = sum(c.in_flight for c in candidates)
    return math.ceil((1.0 + epsilon) * (total + 1) / len(candidates)) + slack


def choose_by_cost(
    prompt_tokens: int,
    candidates: Sequence[CandidateLoad],
    held: dict[str, Held],
    params: CostParams,
    tie_key: int = 0,
    *,
    start: bool = False,
    place_unheld: bool = True,
) -> KvChoice | None:
    """The candidate with the lowest estimated time to first token under the load bound.
    `start`: the request opens a conversation (placed as new work whatever it holds).
    `place_unheld`: a prompt nobody holds any of is placed as new work (with
    `params.place_new_prefixes`); otherwise, or without candidates, the result is None."""
    if not candidates:
        return None
    if not any(held.get(c.name, NOTHING).any_tokens > 0 for c in candidates):
        if prompt_tokens <= 0 or not (place_unheld and params.place_new_prefixes):
            return None
        return _new_work(prompt_tokens, candidates, held, params, tie_key, start=start)
    most = max(min(held.get(c.name, NOTHING).any_tokens, prompt_tokens) for c in candidates)
    affine = most >= params.affinity_threshold * prompt_tokens
    if prompt_tokens > 0 and (start or not affine):
        return _new_work(prompt_tokens, candidates, held, params, tie_key, start=start)
    bound = load_bound(candidates, params.epsilon, params.bound_slack)
    eligible = [c for c in candidates if c.in_flight < bound] or list(candidates)
    rate = params.prefill_tokens_per_second
    best: tuple[float, int, CandidateLoad, float] | None = None
    n = len(eligible)
    weight = 1.0 + params.miss_penalty
    for i, c in enumerate(eligible):
        fresh = new_tokens(prompt_tokens, held.get(c.name, NOTHING), params)
        cost = (c.queued_tokens + fresh * weight) / rate + c.in_flight * params.per_request_s
        # Ties: rotate the start by tie_key so equal candidates split the traffic evenly.
        rank = (i - tie_key) % n
        if best is None or cost < best[0] - 1e-12 or (abs(cost - best[0]) <= 1e-12 and rank < best[1]):
            best = (cost, rank, c, fresh)
    assert best is not None
    cost, _, chosen, fresh = best
    h = held.get(chosen.name, NOTHING)
    held_tokens = min(h.any_tokens, prompt_tokens)
    return KvChoice(
        chosen.name,
        cost,
        h.tier,
        held_tokens,
        round(fresh),
        h.speculative and h.any_tokens > 0,
        held_tokens / prompt_tokens if prompt_tokens > 0 else 0.0,
        moved=_moved(prompt_tokens, chosen.name, candidates, eligible, held, reason="cost"),
    )


def _new_work(
    prompt_tokens: int,
    candidates: Sequence[CandidateLoad],
    held: dict[str, Held],
    params: CostParams,
    tie_key: int,
    *,
    start: bool,
) -> KvChoice:
    """Work that holds little of its prompt anywhere, or the start of a conversation."""
    bound = load_bound(candidates, params.epsilon, params.bound_slack)
    eligible = [c for c in candidates if c.in_flight < bound] or list(candidates)
    depth = {c.name: min(held.get(c.name, NOTHING).any_tokens, prompt_tokens) for c in candidates}
    most = max(depth.values())
    affine = most > 0 and most >= params.affinity_threshold * prompt_tokens
    # The slack is room for cache affinity: work that holds little of its prompt anywhere is
    # placed under the bound without it, so a burst of new conversations cannot fill a backend
    # to the point where the next turn of one it already serves has to leave its history
    # behind. (A conversation start that holds most of its prompt, a long shared document, has
    # affinity and keeps the slack.)
    strict = bound if affine else bound - params.bound_slack
    room = [c for c in eligible if c.in_flight < strict] or eligible
    if start and affine:
        kept = _stay_with_holder(
            prompt_tokens, candidates, room, depth=depth, held=held, params=params, tie_key=tie_key
        )
        if kept is not None:
            return kept
        # Its holders are busier than the tolerance allows: a second copy goes elsewhere.
        room = [c for c in room if depth[c.name] < most] or room
    placed = _place(prompt_tokens, room, held, params, tie_key)
    return replace(placed, moved=_moved(prompt_tokens, placed.backend, candidates, eligible, held, reason="placed"))


def _stay_with_holder(
    prompt_tokens: int,
    candidates: Sequence[CandidateLoad],
    room: Sequence[CandidateLoad],
    *,
    depth: dict[str, int],
    held: dict[str, Held],
    params: CostParams,
    tie_key: int,
) -> KvChoice | None:
    """A conversation start that holds most of its prompt on some backends (a long shared
    document or system prompt) stays with the least busy of them while its recent demand per
    unit of weight is within `placement_tolerance` of the mean (or `placement_tolerance_tokens`
    above it, whichever is more): a copy of a shared prefix on a second backend costs a full
    prefill and cache space for good, while balance can come from where new prefixes go."""
    most = max(depth.values())
    total_weight = sum(max(c.weight, 1) for c in candidates)
    mean = sum(c.demand for c in candidates) / total_weight
    limit = max((1.0 + params.placement_tolerance) * mean, mean + params.placement_tolerance_tokens)
    n = len(room)
    best: tuple[float, int, CandidateLoad] | None = None
    for i, c in enumerate(room):
        share = c.demand / max(c.weight, 1)
        if depth[c.name] < most or share > limit:
            continue
        share += c.committed / max(c.weight, 1)
        rank = (i - tie_key) % n
        if best is None or share < best[0] - 1e-9 or (abs(share - best[0]) <= 1e-9 and rank < best[1]):
            best = (share, rank, c)
    if best is None:
        return None
    chosen = best[2]
    h = held.get(chosen.name, NOTHING)
    fresh = round(new_tokens(prompt_tokens, h, params))
    return KvChoice(chosen.name, 0.0, h.tier, most, fresh, False, most / prompt_tokens, placed=True)


def _place(
    prompt_tokens: int, eligible: Sequence[CandidateLoad], held: dict[str, Held], params: CostParams, tie_key: int
) -> KvChoice:
    """New work: the eligible candidate with the least recent demand per unit of weight, plus
    what the request would prefill there (charged like a miss). Placement keeps the spread of
    demand within about one prompt, so what a candidate holds of this request still counts:
    a conversation's turn that holds little of its (long) prompt stays home unless home is
    busier by more than its history is worth."""
    n = len(eligible)
    best: tuple[float, int, CandidateLoad] | None = None
    weight = 1.0 + params.placement_miss_penalty
    for i, c in enumerate(eligible):
        fresh = new_tokens(prompt_tokens, held.get(c.name, NOTHING), params)
        load = (c.demand + c.committed + c.queued_tokens) / max(c.weight, 1) + fresh * weight
        rank = (i - tie_key) % n
        if best is None or load < best[0] - 1e-9 or (abs(load - best[0]) <= 1e-9 and rank < best[1]):
            best = (load, rank, c)
    assert best is not None
    chosen = best[2]
    h = held.get(chosen.name, NOTHING)
    held_tokens = min(h.any_tokens, prompt_tokens)
    fresh = round(new_tokens(prompt_tokens, h, params))
    return KvChoice(chosen.name, 0.0, h.tier, held_tokens, fresh, False, held_tokens / prompt_tokens, placed=True)


_STARTS = "starts"
_LATER = "later"


class StartCommitments:
    """The later demand still expected from conversations recently started on each backend
    (pure; the caller passes the clock).

    A conversation's first turn commits its backend to every later turn, but recent demand
    counts a turn only once it is sent: a backend that just took a run of starts looks no busier
    than one that took a run of one-shot requests, and keeps attracting starts. Each start is
    booked at what starts have recently brought afterwards, per start, across the fleet (the new
    tokens of requests that are not starts over the number of starts, both over the demand
    half-life), and fades with `half_life_s`. Traffic whose requests are all starts (one-shot
    questions) books nothing."""

    def __init__(self, half_life_s: float, demand_half_life_s: float) -> None:
        self._starts = DecayingDemand(half_life_s)
        self._fleet = DecayingDemand(demand_half_life_s)

    def record(self, backend: str, tokens: float, now: float, *, start: bool, age: float = 0.0) -> None:
        """A request routed to `backend` with `tokens` of demand `age` seconds ago; `start`: it
        opened a conversation."""
        if start:
            self._starts.add(backend, 1.0, now, age=age)
            self._fleet.add(_STARTS, 1.0, now, age=age)
        else:
            self._fleet.add(_LATER, tokens, now, age=age)

    def per_start(self, now: float) -> float:
        """What a start has recently brought afterwards, fleet-wide (0 before any start; a
        lone, long-faded start counts as one, so it cannot inflate the rate)."""
        starts = self._fleet.value(_STARTS, now)
        return self._fleet.value(_LATER, now) / max(1.0, starts) if starts > 0.0 else 0.0

    def value(self, backend: str, now: float, per_start: float | None = None) -> float:
        """`backend`'s commitment; pass `per_start(now)` when asking for several backends."""
        rate = self.per_start(now) if per_start is None else per_start
        return self._starts.value(backend, now) * rate if rate > 0.0 else 0.0

    def clear(self) -> None:
        self._starts.clear()
        self._fleet.clear()


class DecayingDemand:
    """New prompt tokens sent to each backend, decaying with a half-life (pure; the caller
    passes the clock)."""

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self._values: dict[str, tuple[float, float]] = {}  # backend -> (value, at)

    def add(self, backend: str, tokens: float, now: float, *, age: float = 0.0) -> None:
        """`tokens` sent `age` seconds before `now` (a replayed decision): as much as is left of
        them by now."""
        if age > 0.0:
            tokens *= 0.5 ** (age / self.half_life_s)
        self._values[backend] = (self.value(backend, now) + tokens, now)

    def value(self, backend: str, now: float) -> float:
        entry = self._values.get(backend)
        if entry is None:
            return 0.0
        value, at = entry
        decayed: float = value * 0.5 ** (max(0.0, now - at) / self.half_life_s)
        return decayed

    def clear(self) -> None:
        self._values.clear()


def choose_by_seed(
    prompt_tokens: int, candidates: Sequence[CandidateLoad], held: dict[str, Held], weights: Weights
) -> KvChoice | None:
    """The seed's composite score over token holdings (holders only; > 0.3 decides)."""
    rows = [(c, held.get(c.name, NOTHING)) for c in candidates]
    most = max((min(h.any_tokens, prompt_tokens) for _, h in rows), default=0)
    if most <= 0:
        return None
    max_load = max((c.in_flight for c in candidates), default=0)
    best: KvChoice | None = None
    for c, h in rows:
        held_tokens = min(h.any_tokens, prompt_tokens)
        if held_tokens <= 0:
            continue
        gpu = h.gpu_tokens > 0
        raw = held_tokens / most
        overlap = raw * (weights.gpu_tier if gpu else weights.storage_tier)
        if overlap < weights.min_overlap:
            continue
        load_ratio = c.in_flight / max_load if max_load > 0 else 0.0
        health = min(max(c.success_rate, 0.0), 1.0)
        score = weights.overlap * overlap + weights.load * (1.0 - load_ratio) + weights.health * health
        if best is None or score > best.score:
            best = KvChoice(c.name, score, h.tier, held_tokens, prompt_tokens - held_tokens, h.speculative, score)
    if best is None or not best.score > SCORER_THRESHOLD:
        return None
    return best
