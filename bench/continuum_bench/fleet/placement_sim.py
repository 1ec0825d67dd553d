"""Offline replay of the KV cost model's decisions (continuum_ingress/policy/kv_cost.py) on the
benchmark's own workloads: the router's real `choose_by_cost` against a simple fleet model,
many seeds in seconds. It is for choosing the cost model's parameters; `bench compare` on the
simulated fleet is the measurement.

The model: each engine is an LRU cache of prompt blocks (shared-prompt and multi-turn: the
chained 16-token blocks of the workload's own token ids, 1,500 per engine as in `bench
compare`; conversations and trace: 512-token trace blocks, 1M tokens per engine), a FIFO
prefill server (25,000 tokens/s plus 10 ms) and 6.5 ms per output token. The router sees
exactly what each engine holds (no event delay), its requests in flight, its queued prefill
tokens and the decayed demand, as the ingress does. Hit/ideal divides the fleet's prompt tokens
served from cache by those of one pooled LRU of the fleet's size, as `bench compare` does.

A move is a request sent to a backend that holds less of its prompt than another does: `bound`
(every deepest holder was at the load bound), `cost` (a queue outweighed the cache) or `placed`
(new work, a start or a copy of a shared prefix, placed for balance).

Variants: `default` (the configured defaults), any `key=value[,key=value]` overrides of
`kv_cache_index.scoring.cost`, `sticky` (always the deepest holder, the least busy among equal
ones, no load bound: what the cache-aware peers do while their balance gates stay closed) and
`demand-only` (conversation starts placed by recent demand plus the placement miss charge, and
prompts nobody holds left to a hash of their prefix key, with no tolerance for the holder).

    python -m continuum_bench.fleet.placement_sim --workloads shared-prompt,multi-turn --seeds 1-8 \\
        --variant default --variant load_bound_slack=1 --variant sticky
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
import statistics
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from continuum_bench.fleet.conversations import ConversationShape, mooncake_turns, plan_conversations
from continuum_bench.fleet.tokens import Texts, make_codec
from continuum_bench.fleet.trace import TRACE_BLOCK, load_trace
from continuum_bench.fleet.workloads import MultiTurnWorkload, SharedPromptWorkload
from continuum_common.config.kv_index import CostModel
from continuum_common.ring import HashRing
from continuum_ingress.policy import kv_cost as K
from continuum_ingress.policy.scorer import HoldingTier

ENGINES = 4
PREFILL_TOKENS_PER_S = 25_000.0
OVERHEAD_S = 0.010
DECODE_S_PER_TOKEN = 0.0065
CHAT_BLOCK = 16
CHAT_CAPACITY = 1_500  # blocks per engine (bench compare's default for the small workloads)
TRACE_CAPACITY = 62_500 * 16 // TRACE_BLOCK  # 1M tokens per engine, in trace blocks


@dataclass
class Request:
    at: float
    blocks: list[Hashable]  # the prompt's full blocks, in chain order
    tokens: int
    output_tokens: int
    start: bool  # the first turn of a chat conversation
    key: str  # its prefix key (for the hash of `demand-only`)
    after: list[Hashable] = field(default_factory=list)  # blocks the answer adds (multi-turn)
    follow: FollowUp | None = None


class FollowUp(Protocol):
    start: float  # when its first request arrives

    def next(self, at: float) -> Request | None: ...

    def think(self) -> float: ...


class Cache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[Hashable, None] = OrderedDict()

    def held(self, blocks: Sequence[Hashable]) -> int:
        n = 0
        for b in blocks:
            if b not in self.blocks:
                break
            n += 1
        return n

    def touch(self, blocks: Iterable[Hashable]) -> None:
        for b in blocks:
            self.blocks[b] = None
            self.blocks.move_to_end(b)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


@dataclass
class Engine:
    name: str
    cache: Cache
    prefill_free: float = 0.0
    in_flight: int = 0
    queued: int = 0
    requests: int = 0


# -- workloads ---------------------------------------------------------------------------------


def _chain(ids: Sequence[int]) -> list[Hashable]:
    out: list[Hashable] = []
    parent = b""
    for i in range(len(ids) // CHAT_BLOCK):
        digest = hashlib.blake2b(parent + repr(ids[i * CHAT_BLOCK : (i + 1) * CHAT_BLOCK]).encode(), digest_size=8)
        parent = digest.digest()
        out.append(parent)
    return out


def shared_prompt(seed: int, texts: Texts) -> tuple[list[Request], list[FollowUp]]:
    requests = []
    for session in SharedPromptWorkload(texts, seed=seed).sessions():
        r = session.next_request(None)
        assert r is not None
        doc = str(r.body["messages"][0]["content"])[:64]
        requests.append(Request(session.start, _chain(r.prompt_ids), len(r.prompt_ids), r.max_tokens, True, doc))
    return requests, []


class _Turns:
    """One multi-turn conversation; its answers are text of the planned length."""

    def __init__(self, session: Any, texts: Texts, rng: random.Random) -> None:
        self.session, self.texts, self.rng = session, texts, rng
        self.start = float(session.start)
        self.previous: str | None = None
        self.sent = 0

    def next(self, at: float) -> Request | None:
        r = self.session.next_request(self.previous)
        if r is None:
            return None
        self.sent += 1
        ids = r.prompt_ids
        self.previous = self.texts.text(r.max_tokens, self.rng)
        full = _chain(list(ids) + self.texts.codec.encode(self.previous)[: r.max_tokens])
        blocks = _chain(ids)
        key = str(r.body["messages"][0]["content"])[:64]
        return Request(at, blocks, len(ids), r.max_tokens, self.sent == 1, key, full[len(blocks) :], self)

    def think(self) -> float:
        return float(self.session.think_time())


def multi_turn(seed: int, texts: Texts) -> tuple[list[Request], list[FollowUp]]:
    sessions = MultiTurnWorkload(texts, seed=seed).sessions()
    return [], [_Turns(s, texts, random.Random(f"answer-{seed}-{i}")) for i, s in enumerate(sessions)]


def conversations(seed: int, duration: float = 240.0) -> tuple[list[Request], list[FollowUp]]:
    shape = ConversationShape()
    plans = plan_conversations(shape, duration=duration, seed=seed, max_context=65_536)
    out = []
    for _, turn, line in mooncake_turns(plans, shape, seed):
        blocks: list[Hashable] = list(line.hash_ids[: line.input_length // TRACE_BLOCK])
        key = str(line.hash_ids[0])
        out.append(Request(line.timestamp_ms / 1000, blocks, line.input_length, line.output_length, turn == 0, key))
    return out, []


def trace_window(path: Path, seed: int, duration: float) -> tuple[list[Request], list[FollowUp]]:
    """Window `seed` of the trace: seconds [(seed - 1) · duration, seed · duration)."""
    out = []
    for line in load_trace(path, start_s=(seed - 1) * duration, duration_s=duration):
        at = line.timestamp_ms / 1000
        blocks: list[Hashable] = list(line.hash_ids[: line.input_length // TRACE_BLOCK])
        key = str(line.hash_ids[0])
        out.append(Request(at, blocks, line.input_length, line.output_length, False, key))
    return out, []


# -- policies ----------------------------------------------------------------------------------

Policy = Callable[[int, list[K.CandidateLoad], dict[str, K.Held], int, bool], K.KvChoice | None]


def cost_policy(params: K.CostParams) -> Policy:
    def decide(
        prompt: int, loads: list[K.CandidateLoad], held: dict[str, K.Held], tie: int, start: bool
    ) -> K.KvChoice | None:
        return K.choose_by_cost(prompt, loads, held, params, tie, start=start)

    return decide


def sticky_policy(
    prompt: int, loads: list[K.CandidateLoad], held: dict[str, K.Held], tie: int, start: bool
) -> K.KvChoice | None:
    if not held:
        return None
    deepest = max(h.any_tokens for h in held.values())
    chosen = min((c for c in loads if held.get(c.name, K.NOTHING).any_tokens == deepest), key=lambda c: c.in_flight)
    return K.KvChoice(chosen.name, 0.0, HoldingTier.GPU_HOT, deepest, prompt - deepest, False)


def demand_only_policy(params: K.CostParams) -> Policy:
    """Starts placed by demand plus the miss charge; nobody-holds prompts left to the hash."""
    unheld = replace(params, place_new_prefixes=False)

    def decide(
        prompt: int, loads: list[K.CandidateLoad], held: dict[str, K.Held], tie: int, start: bool
    ) -> K.KvChoice | None:
        choice = K.choose_by_cost(prompt, loads, held, unheld, tie, start=False)
        if not start or choice is None:
            return choice
        bound = K.load_bound(loads, params.epsilon, params.bound_slack)
        eligible = [c for c in loads if c.in_flight < bound] or loads
        most = max(min(held.get(c.name, K.NOTHING).any_tokens, prompt) for c in loads)
        strict = bound if most >= params.affinity_threshold * prompt else bound - params.bound_slack
        room = [c for c in eligible if c.in_flight < strict] or eligible
        return K._place(prompt, room, held, params, tie)

    return decide


KINDS = ("default", "sticky", "demand-only")


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """`default` | `sticky` | `demand-only`, optionally with `key=value` overrides of
    `kv_cache_index.scoring.cost` (comma-separated; values in JSON: 0.25, 4000, false)."""
    kind, overrides = "default", {}
    for item in (part.strip() for part in spec.split(",")):
        name, eq, value = item.partition("=")
        if not eq and name in KINDS:
            kind = name
            continue
        try:
            overrides[name] = json.loads(value)
        except ValueError:
            raise SystemExit(f"variant {spec!r}: {item!r} is neither {', '.join(KINDS)} nor key=<JSON value>") from None
    return kind, overrides


def make_policy(spec: str) -> Policy:
    kind, overrides = parse_variant(spec)
    if kind == "sticky":
        return sticky_policy
    params = K.CostParams.from_config(CostModel(**overrides), default_epsilon=0.25)
    return demand_only_policy(params) if kind == "demand-only" else cost_policy(params)


# -- the replay --------------------------------------------------------------------------------


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _ring(ring: HashRing, key: str, engines: Sequence[Engine]) -> Engine:
    """PrefixAwareHash: the router's own bounded-load ring over the key's SHA-256 digest."""
    loads = {e.name: e.in_flight for e in engines}
    name = ring.lookup(hashlib.sha256(key.encode()).digest(), "model", loads).backend
    return next(e for e in engines if e.name == name)


@dataclass
class Outcome:
    hit_ideal: float
    imbalance: float
    moves: dict[str, int]


def replay(requests: list[Request], follow: list[FollowUp], policy: Policy, *, block: int,
           capacity: int, cost: CostModel, speed: tuple[float, float] = (1.0, 1.0)) -> Outcome:  # fmt: skip
    """`speed`: the model's prefill rate and decode time per token, as multiples of the defaults."""
    prefill_rate, decode_s = PREFILL_TOKENS_PER_S * speed[0], DECODE_S_PER_TOKEN * speed[1]
    engines = [Engine(f"e{i}", Cache(capacity)) for i in range(ENGINES)]
    ring = HashRing([e.name for e in engines])
    pooled = Cache(capacity * ENGINES)
    demand = K.DecayingDemand(cost.demand_half_life_seconds)
    commitments = (
        K.StartCommitments(cost.commitment_half_life_seconds, cost.demand_half_life_seconds)
        if cost.commitment_half_life_seconds > 0
        else None
    )
    events: list[tuple[float, int, str, Any]] = []
    counter = 0

    def push(at: float, kind: str, data: Any) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (at, counter, kind, data))

    for r in requests:
        push(r.at, "arrive", r)
    for f in follow:
        push(f.start, "turn", f)
    hit = ideal = 0
    moves = {"cost": 0, "bound": 0, "placed": 0}
    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "turn":
            nxt = data.next(now)
            if nxt is not None:
                push(now, "arrive", nxt)
        elif kind == "first":
            data[0].queued -= data[1]
        elif kind == "done":
            engine, r = data
            engine.in_flight -= 1
            engine.cache.touch(r.after)
            pooled.touch(r.after)
            if r.follow is not None:
                push(now + r.follow.think(), "turn", r.follow)
        else:
            engine, got = _route(data, engines, ring, policy, (demand, commitments), now, block, moves, cost)
            hit += got
            ideal += min(data.tokens, pooled.held(data.blocks) * block)
            pooled.touch(data.blocks)
            fresh = data.tokens - got
            engine.in_flight += 1
            engine.queued += fresh
            engine.requests += 1
            first = max(now, engine.prefill_free) + fresh / prefill_rate
            engine.prefill_free = first
            push(first + OVERHEAD_S, "first", (engine, fresh))
            push(first + OVERHEAD_S + data.output_tokens * decode_s, "done", (engine, data))
    counts = [e.requests for e in engines]
    return Outcome(hit / ideal if ideal else 1.0, max(counts) / statistics.mean(counts), moves)


Measures = tuple[K.DecayingDemand, K.StartCommitments | None]


def _route(r: Request, engines: list[Engine], ring: HashRing, policy: Policy, measures: Measures, now: float, block: int,
           moves: dict[str, int], cost: CostModel) -> tuple[Engine, int]:  # fmt: skip
    demand, commitments = measures
    depth = {e.name: e.cache.held(r.blocks) for e in engines}
    held = {n: K.Held(min(r.tokens, d * block), min(r.tokens, d * block)) for n, d in depth.items() if d > 0}
    loads = [
        K.CandidateLoad(
            e.name, e.in_flight, e.queued, 1.0, demand.value(e.name, now), 1,
            commitments.value(e.name, now) if commitments is not None else 0.0,
        )
        for e in engines
    ]  # fmt: skip
    choice = policy(r.tokens, loads, held, _hash(r.key) & 0xFFFF, r.start)
    engine = _ring(ring, r.key, engines) if choice is None else next(e for e in engines if e.name == choice.backend)
    if depth[engine.name] < max(depth.values()):
        # counted the same way for every policy: the choice holds less than the deepest holder
        moves[choice.moved if choice is not None and choice.moved is not None else "placed"] += 1
    got = min(r.tokens, depth[engine.name] * block)
    engine.cache.touch(r.blocks)
    tokens = r.tokens - got + cost.placement_request_tokens
    demand.add(engine.name, tokens, now)
    if commitments is not None:
        commitments.record(engine.name, tokens, now, start=r.start)
    return engine, got


# -- the command -------------------------------------------------------------------------------


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def _workload(name: str, seed: int, texts: Texts, args: argparse.Namespace) -> tuple[list[Request], list[FollowUp], int, int]:  # fmt: skip
    if name == "shared-prompt":
        return *shared_prompt(seed, texts), CHAT_BLOCK, CHAT_CAPACITY
    if name == "multi-turn":
        return *multi_turn(seed, texts), CHAT_BLOCK, CHAT_CAPACITY
    if name == "conversations":
        return *conversations(seed, args.duration), TRACE_BLOCK, TRACE_CAPACITY
    if name == "trace":
        return *trace_window(args.trace, seed, args.trace_duration), TRACE_BLOCK, TRACE_CAPACITY
    raise SystemExit(f"unknown workload {name!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m continuum_bench.fleet.placement_sim", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--workloads",
        default="shared-prompt,multi-turn",
        help="shared-prompt, multi-turn, conversations, trace (comma-separated)",
    )
    parser.add_argument("--seeds", default="1-8", help="e.g. 1-8 or 1,3,5 (trace: 300-s windows of the trace)")
    parser.add_argument(
        "--variant", action="append", help="default | sticky | demand-only | key=value,... (repeatable)"
    )
    parser.add_argument("--trace", type=Path, help="Mooncake-format JSONL for the trace workload")
    parser.add_argument("--trace-duration", type=float, default=300.0)
    parser.add_argument("--duration", type=float, default=240.0, help="conversations: seconds of starts")
    parser.add_argument(
        "--timing-spread", type=float, default=0.0,
        help="also replay each seed with prefill this fraction faster and decode slower, and the reverse "
        "(three runs per seed: how much a decision depends on timing)",
    )  # fmt: skip
    args = parser.parse_args(argv)  # fmt: skip
    if "trace" in args.workloads.split(",") and args.trace is None:
        parser.error("the trace workload needs --trace FILE")
    texts = Texts(make_codec("builtin"))
    seeds = _seeds(args.seeds)
    spread = args.timing_spread
    speeds = [(1.0, 1.0)] + ([(1 + spread, 1 - spread), (1 - spread, 1 + spread)] if spread else [])
    print(
        "| workload | variant | mean hit/ideal | runs over 1.3 | per run: hit/ideal · imbalance · moves (placed/bound/cost) |"
    )
    print("|---|---|---:|---:|---|")
    for name in args.workloads.split(","):
        for spec in args.variant or ["default"]:
            cost = CostModel(**parse_variant(spec)[1])
            rows = []
            for seed in seeds:
                for speed in speeds:
                    requests, follow, block, capacity = _workload(name, seed, texts, args)
                    policy = make_policy(spec)
                    rows.append(
                        replay(requests, follow, policy, block=block, capacity=capacity, cost=cost, speed=speed)
                    )
            mean = statistics.mean(r.hit_ideal for r in rows)
            over = sum(r.imbalance > 1.3 for r in rows)
            cells = " ".join(
                f"{r.hit_ideal:.3f}·{r.imbalance:.2f}·{r.moves['placed']}/{r.moves['bound']}/{r.moves['cost']}"
                for r in rows
            )
            print(f"| {name} | {spec} | {mean:.4f} | {over} of {len(rows)} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
