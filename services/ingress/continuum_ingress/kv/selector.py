"""KvSelector: Tier 4's routing decision for one request (docs/kv-scorer.md).

For the candidates of an attempt it

1. computes the request's keys in each candidate's match group (kv/groups.py): the engine's
   block hashes (precise), text-chunk hashes (approximate) or the seed's prefix key;
2. finds how much of the prompt each candidate holds as a leading prefix: the block index
   (engine events) plus this router's speculative entries in precise mode, the route memory in
   approximate mode, the prefix-key index in prefix_key mode;
3. lets the scoring model choose (policy/kv_cost.py): the lowest estimated time to first token
   under the CHWBL load bound (`cost`), or the seed's composite score (`seed`).

After the attempt's backend is known (whether the scorer or the configured strategy chose it),
`note()` records the request's keys against it (speculative / approximate entries), shares that
with the other ingress replicas over NATS, and tells the pool how many uncached prompt tokens
the backend now has to prefill.

With `scoring: seed` and every candidate in prefix_key mode this is exactly the seed's scorer
(KvOverlapScorer: prepare, score, threshold 0.3).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from continuum_common.config.router import RouterConfig
from continuum_common.kvindex.blocks import BlockMatch
from continuum_common.kvindex.types import KvIndexError
from continuum_common.ring import RouteLabel
from continuum_common.wire.decisions import KIND_ANSWER, KIND_APPROXIMATE, KIND_SPECULATIVE, Decision, Tokenized
from continuum_ingress.hooks import ANSWER_RECORDER
from continuum_ingress.kv.answers import AnswerRecorder, reads_answers
from continuum_ingress.kv.audit import TokenizerAudit
from continuum_ingress.kv.block_reads import BlockReads
from continuum_ingress.kv.chunks import answered_chain
from continuum_ingress.kv.groups import GroupRuntime, RequestKeys, build_groups
from continuum_ingress.kv.remote_tokens import RemoteTokens
from continuum_ingress.kv.rests import RestQueue
from continuum_ingress.kv.scorer import KvOverlapScorer
from continuum_ingress.kv.tokenize import TokenizeFailed
from continuum_ingress.policy.kv_cost import (
    CandidateLoad,
    CostParams,
    DecayingDemand,
    Held,
    KvChoice,
    StartCommitments,
    choose_by_cost,
    choose_by_seed,
)
from continuum_ingress.policy.kv_scoring import Weights
from continuum_ingress.policy.scorer import best_scored
from continuum_ingress.protocol.requests import conversation_start, prompt_token_ids

if TYPE_CHECKING:
    from continuum_common.tokenization import PartialPrompt
    from continuum_ingress.kv.metrics import KvScorerMetrics
    from continuum_ingress.pool import BackendState
    from continuum_ingress.snapshot import RouterSnapshot
    from continuum_ingress.state import RequestState
    from continuum_ingress.transport import Upstream

log = logging.getLogger("continuum.ingress.kv")

EXTRAS_KEY = "kv"
# Prompts whose unheld rest waits to be encoded after their request was forwarded; past this,
# a rest is not encoded (counted: the next turn then encodes it).
MAX_PENDING_RESTS = 64
# The held part of a prompt is encoded on the request path in steps of 1, 4, 16, 16, ... pieces
# (about 250 tokens each), reading the index after each, and lets the event loop serve the other
# requests and streams once a step ends past this much encoding: a held part the prompt encoder
# has not cached (a conversation another replica saw, or one the cache let go) is tens of ms.
MAX_HELD_STEP = 16
HELD_SLICE_S = 0.002


@dataclass(slots=True)
class _Plan:
    """What decide() learnt about a request, for note()."""

    keys: dict[str, RequestKeys]  # group name -> keys
    prompt_tokens: int
    held: dict[str, Held]
    legacy: bool = False
    # precise mode: leading blocks of the chain the block index confirms, per backend
    indexed: dict[str, int] = field(default_factory=dict)
    # the block index could not be read: a prompt nothing is known of goes to the strategy
    index_failed: bool = False
    start: bool = False  # the request opens a conversation
    # local tokenizer, `tokenize_unheld_text: off_path`: prompts encoded only as far as held,
    # by group (their rest is encoded after the request is forwarded), and the last index read
    # made while deciding how far (chain length, matches), which _held reuses
    partial: dict[str, tuple[PartialPrompt, Upstream | None]] = field(default_factory=dict)
    matched: dict[str, tuple[int, dict[str, BlockMatch]]] = field(default_factory=dict)


@dataclass(slots=True)
class _Rest:
    """A prompt routed on its held part, to be encoded whole once its request was forwarded."""

    group: GroupRuntime
    prompt: PartialPrompt
    client: Upstream | None  # for the tokenizer audit, once the chain is whole
    decision: Decision  # what note() recorded, shared once the chain is whole
    indexed: int  # leading blocks the block index confirmed (not recorded again)
    state: RequestState


class KvSelector:
    def __init__(
        self,
        config: RouterConfig,
        *,
        prefix_scorer: KvOverlapScorer,
        block_reads: BlockReads,
        metrics: KvScorerMetrics,
        replica: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        section = config.kv_cache_index
        self.section = section
        self.prefix_scorer = prefix_scorer
        self.block_reads = block_reads
        self.metrics = metrics
        self.replica = replica
        self.clock = clock
        self.groups, self.group_of = build_groups(config)
        self.model = section.scoring.model
        self.weights = Weights.from_config(section.scoring)
        self.params = CostParams.from_config(section.scoring.cost, config.prefix_routing.load_factor_epsilon)
        cost = section.scoring.cost
        self.demand = DecayingDemand(cost.demand_half_life_seconds)
        # only the cost model places work; the composite formula has no use for commitments
        self.commitments = (
            StartCommitments(cost.commitment_half_life_seconds, cost.demand_half_life_seconds)
            if cost.commitment_half_life_seconds > 0 and self.model == "cost"
            else None
        )
        # every request also counts as this many new tokens (docs/kv-scorer.md, placement)
        self.request_tokens = section.scoring.cost.placement_request_tokens
        self.place_starts = section.scoring.cost.place_conversation_starts
        self.share: Callable[[Decision], None] | None = None  # set once NATS is connected
        self.share_decisions = section.share_decisions
        self.kv_aware_by_backend: Counter[str] = Counter()
        self.audits = {
            g.name: TokenizerAudit(g, lambda group, result: metrics.tokenizer_audits.labels(group, result).inc())
            for g in self.groups.values()
            if g.encoder is not None
        }
        self.remote = {
            g.name: RemoteTokens(
                g,
                lambda group, how: metrics.remote_tokenize.labels(group, how).inc(),
                max_blocks=g.config.tokenize_memory_blocks,
                replica=replica,
                clock=clock,
                member=partial(self._in_group, g),
            )
            for g in self.groups.values()
            if g.mode == "precise" and g.encoder is None and g.config is not None and g.hasher is not None
        }
        self._rests: RestQueue[_Rest] = RestQueue(self._finish_rest, self._rest_failed, limit=MAX_PENDING_RESTS)
        self.held_slice_seconds = HELD_SLICE_S
        self.timeout_s = 0.1 + max(
            (g.config.tokenize_timeout_ms / 1000 for g in self.groups.values() if g.config is not None), default=0.0
        )

    def _in_group(self, group: GroupRuntime, backend: str) -> bool:
        return self.group_of.get(backend) is group

    # ---- the decision ------------------------------------------------------------------------

    async def decide(
        self, state: RequestState, snapshot: RouterSnapshot, candidates: Sequence[BackendState]
    ) -> KvChoice | None:
        by_group: dict[str, list[BackendState]] = {}
        for c in candidates:
            group = self.group_of.get(c.name) or self.groups["*"]
            by_group.setdefault(group.name, []).append(c)
        if self.model == "seed" and all(self.groups[g].mode == "prefix_key" for g in by_group):
            return await self._legacy(state, candidates)
        plan = _Plan({}, 0, {})
        state.extras[EXTRAS_KEY] = plan
        for name, members in by_group.items():
            group = self.groups[name]
            started = time.perf_counter()
            keys = await self._compute_keys(group, state, snapshot, members, plan)
            self._observe_keys(group, keys, started)
            plan.keys[name] = keys
            plan.prompt_tokens = max(plan.prompt_tokens, keys.prompt_tokens)
            await self._held(group, keys, state, members, plan)
        now = self.clock()
        committed = self._committed(candidates, now)
        loads = [
            CandidateLoad(
                c.name,
                c.in_flight,
                c.queued_tokens,
                c.success_rate,
                self.demand.value(c.name, now),
                c.weight,
                committed.get(c.name, 0.0),
            )
            for c in candidates
        ]
        plan.start = conversation_start(state.request)
        if self.model == "seed":
            return choose_by_seed(plan.prompt_tokens, loads, plan.held, self.weights)
        start = self.place_starts and plan.start
        choice = choose_by_cost(
            plan.prompt_tokens,
            loads,
            plan.held,
            self.params,
            _tie_key(plan.keys),
            start=start,
            place_unheld=not plan.index_failed,
        )
        if choice is not None and choice.moved is not None:
            self.metrics.affinity_moves.labels(choice.moved).inc()
        return choice

    def _committed(self, candidates: Sequence[BackendState], now: float) -> dict[str, float]:
        """Each candidate's start commitment (the fleet-wide rate computed once)."""
        if self.commitments is None:
            return {}
        rate = self.commitments.per_start(now)
        if rate <= 0.0:
            return {}
        return {c.name: self.commitments.value(c.name, now, rate) for c in candidates}

    def _observe_keys(self, group: GroupRuntime, keys: RequestKeys, started: float) -> None:
        self.metrics.keys_seconds.labels(keys.mode).observe(time.perf_counter() - started)
        if keys.fallback is not None:
            self.metrics.precise_fallbacks.labels(group.name, keys.fallback).inc()

    async def _compute_keys(
        self,
        group: GroupRuntime,
        state: RequestState,
        snapshot: RouterSnapshot,
        members: Sequence[BackendState],
        plan: _Plan,
    ) -> RequestKeys:
        if group.mode == "approximate":
            return group.approximate_keys(state)
        if group.mode == "prefix_key":
            return group.prefix_key_keys(state)
        ids = prompt_token_ids(state.request)
        if ids is not None:  # the engine hashes exactly these: no tokenizer, no call
            return group.keys_from_tokens(state, ids)
        if group.precise_disabled is not None:
            return group.approximate_keys(state, "disabled")
        if group.encoder is not None:
            try:
                prompt = group.begin_local(state)
                if not prompt.done:
                    if group.config is None or group.config.tokenize_unheld_text == "on_path":
                        prompt.finish()
                    else:
                        await self._encode_held(group, prompt, members, plan)
                keys = group.local_keys(prompt)
            except Exception as exc:  # TokenizationError, or anything the template raised
                log.warning("local tokenizer failed for group %s: %s", group.name, type(exc).__name__)
                return group.approximate_keys(state, "tokenizer_error")
            self.metrics.local_encoding.labels(group.name, "whole" if prompt.done else "held").inc()
            client = snapshot.clients.get(members[0].name)
            if prompt.done:
                self._audit(group, state, client, keys.chain)
            else:
                plan.partial[group.name] = (prompt, client)  # audited once whole (_finish_rest)
            return keys
        remote = self.remote.get(group.name)
        # the least busy member tokenizes (the call costs it a little CPU)
        asked = min(members, key=lambda m: m.in_flight).name
        client = snapshot.clients.get(asked)
        if client is None or remote is None:
            return group.approximate_keys(state, "tokenize_failed")
        try:
            return await remote.keys(state, client)
        except TokenizeFailed as exc:
            log.debug("tokenize on %s failed: %s", asked, exc)
            return group.approximate_keys(state, "tokenize_failed")

    def _audit(self, group: GroupRuntime, state: RequestState, client: Upstream | None, chain: Sequence[int]) -> None:
        """Now and then, check the local tokenizer's keys against an engine's /tokenize."""
        audit = self.audits.get(group.name)
        if audit is not None and client is not None and audit.due():
            audit.start(client, api=state.key_api, body=state.key_body, model=state.model, expected=chain)

    async def _encode_held(
        self, group: GroupRuntime, prompt: PartialPrompt, members: Sequence[BackendState], plan: _Plan
    ) -> None:
        """Encode `prompt` only as far as some member holds it: past the first block no one
        holds (index or speculative entries), no match can reach, so the rest cannot change
        the choice. Pieces are added 1, 4, 16, 16, ... at a time, reading the index after each;
        past `held_slice_seconds` of encoding, the loop serves others before the next step."""
        names = [m.name for m in members]
        step = 1
        slice_end = time.perf_counter() + self.held_slice_seconds
        while not prompt.done:
            chain = prompt.block_hashes
            if chain:
                try:
                    matches = await self.block_reads.match(chain, names)
                except KvIndexError:
                    return  # _held reads again and handles the outage
                plan.matched[group.name] = (len(chain), matches)
                now = self.clock()
                memory = group.memory
                deepest = max(
                    memory.extends(n, chain, matches[n].any_blocks if n in matches else 0, now) for n in names
                )
                if deepest < len(chain):
                    return
            prompt.extend(step)
            step = min(step * 4, MAX_HELD_STEP)
            if time.perf_counter() >= slice_end:
                await asyncio.sleep(0)
                slice_end = time.perf_counter() + self.held_slice_seconds

    async def _held(
        self, group: GroupRuntime, keys: RequestKeys, state: RequestState, members: Sequence[BackendState], plan: _Plan
    ) -> None:
        held = plan.held
        names = [m.name for m in members]
        now = self.clock()
        prompt = keys.prompt_tokens
        per_key = keys.tokens_per_key
        if keys.mode == "approximate":
            for backend, n in group.approximate_memory.match(keys.chain, names, now).items():
                tokens = min(prompt, round(n * per_key))
                held[backend] = Held(tokens, tokens)
            return
        if keys.mode == "prefix_key":
            await self._prefix_held(state, members, prompt, held)
            return
        read = plan.matched.get(group.name)
        try:
            if read is not None and read[0] == len(keys.chain):
                matches = read[1]  # read for this very chain while encoding it (_encode_held)
            else:
                matches = await self.block_reads.match(keys.chain, names)
        except KvIndexError:
            self.metrics.block_read_errors.inc()
            plan.index_failed = True
            matches = {}
        for backend in names:
            m = matches.get(backend)
            gpu = m.gpu_blocks if m is not None else 0
            anyt = m.any_blocks if m is not None else 0
            plan.indexed[backend] = anyt
            # speculative entries continue what the engine already reported (see note())
            spec = group.memory.extends(backend, keys.chain, anyt, now)
            if spec > anyt:
                held[backend] = Held(min(prompt, round(spec * per_key)), min(prompt, round(spec * per_key)), True)
            elif anyt > 0:
                held[backend] = Held(min(prompt, round(gpu * per_key)), min(prompt, round(anyt * per_key)))

    async def _prefix_held(
        self, state: RequestState, members: Sequence[BackendState], prompt: int, held: dict[str, Held]
    ) -> None:
        key = state.prefix_key
        if key is None:
            return
        await self.prefix_scorer.prepare(key, members)
        for h in self.prefix_scorer.holdings(key):
            if h.speculative:
                held[h.backend] = Held(prompt, prompt, True)
            elif h.tier.value == "gpu_hot":
                held[h.backend] = Held(h.token_count, h.token_count)
            else:
                held[h.backend] = Held(0, h.token_count)

    async def _legacy(self, state: RequestState, candidates: Sequence[BackendState]) -> KvChoice | None:
        """The seed's scorer on the prefix-key index, unchanged."""
        state.extras[EXTRAS_KEY] = _Plan({}, 0, {}, legacy=True)
        key = state.prefix_key
        if key is None:
            return None
        await self.prefix_scorer.prepare(key, candidates)
        best = best_scored(self.prefix_scorer, key, candidates)
        if best is None:
            return None
        return KvChoice(best.backend, best.score, best.tier, 0, 0, False, best.score)

    # ---- after the choice --------------------------------------------------------------------

    def note(self, state: RequestState, backend: BackendState, kv_aware: bool) -> None:
        """Record where the request went (the scorer's or the strategy's choice)."""
        plan = state.extras.get(EXTRAS_KEY)
        if not isinstance(plan, _Plan):
            return
        if kv_aware and not plan.legacy:
            self.kv_aware_by_backend[backend.name] += 1
        if state.prefix_key is not None and (plan.legacy or self._in_prefix_group(backend.name)):
            # As the seed's scorer: provisional prefix entries after a KV-aware decision or a
            # PrefixAwareHash one (prefix_hash / overflow); other strategies record nothing.
            if kv_aware:
                self.prefix_scorer.note_decision(state.prefix_key, backend.name, "kv_aware")
            elif state.route_label in (RouteLabel.PREFIX_HASH, RouteLabel.OVERFLOW):
                self.prefix_scorer.note_decision(state.prefix_key, backend.name, "prefix_hash")
        group = self.group_of.get(backend.name) or self.groups["*"]
        keys = plan.keys.get(group.name)
        if keys is None or not keys.chain:
            return
        now = self.clock()
        h = plan.held.get(backend.name)
        recorded = keys.chain
        if keys.mode == "precise":
            # Only what the engine has not reported yet: the reported head is in the index.
            recorded = keys.chain[plan.indexed.get(backend.name, 0) :]
            group.memory.record(backend.name, recorded, now)
            kind = KIND_SPECULATIVE
        else:
            group.approximate_memory.record(backend.name, recorded, now)
            kind = KIND_APPROXIMATE
            self._follow_answer(state, group, backend.name)
        fresh = max(0, plan.prompt_tokens - (h.any_tokens if h is not None else 0))
        state.prefill_tokens = fresh
        self._add_demand(backend.name, fresh, now, start=plan.start)
        decision = Decision(
            self.replica, group.name, backend.name, kind, time.time(), list(recorded), fresh, plan.start
        )
        pending = plan.partial.pop(group.name, None)
        if pending is not None and not pending[0].done:
            prompt, client = pending
            self._finish_later(_Rest(group, prompt, client, decision, plan.indexed.get(backend.name, 0), state))
            return
        self._share(decision)

    def _share(self, decision: Decision) -> None:
        if self.share is not None and self.share_decisions:
            self.share(decision)

    def _finish_later(self, rest: _Rest) -> None:
        """Encode the rest of a prompt routed on its held part once its request is written
        upstream (kv/rests.py), and record (and share) its whole chain where it went."""
        if not self._rests.add(rest, rest.prompt):
            self.metrics.local_encoding.labels(rest.group.name, "rest_skipped").inc()
            self._share(rest.decision)

    def _rest_failed(self, rest: _Rest, exc: Exception) -> None:
        log.warning("local tokenizer failed for group %s: %s", rest.group.name, type(exc).__name__)
        self.metrics.local_encoding.labels(rest.group.name, "rest_failed").inc()
        self._share(rest.decision)

    def _finish_rest(self, rest: _Rest, chain: list[int]) -> None:
        group, decision = rest.group, rest.decision
        self.metrics.local_encoding.labels(group.name, "rest_encoded").inc()
        recorded = chain[rest.indexed :]
        group.memory.record(decision.backend, recorded, self.clock())
        self._share(msgspec.structs.replace(decision, keys=list(recorded)))
        self._audit(group, rest.state, rest.client, chain)

    def _follow_answer(self, state: RequestState, group: GroupRuntime, backend: str) -> None:
        """Approximate mode: once a chat request has been answered, record the conversation
        with its answer where it went (kv/chunks.py `answered_chain`)."""
        if not (group.learn_answers and reads_answers(state.api, state.key_api)) or ANSWER_RECORDER in state.extras:
            return
        learn = partial(self._learn_answer, group, backend, state.key_body)
        state.extras[ANSWER_RECORDER] = AnswerRecorder(stream=state.stream, on_answer=learn, api=state.api)

    def _learn_answer(self, group: GroupRuntime, backend: str, body: dict[str, Any], text: str | None) -> None:
        self.metrics.approximate_answers.labels(group.name, "unreadable" if text is None else "learnt").inc()
        if text is None:
            return
        chain = answered_chain(body, text, group.approx.chunk_bytes)
        if not chain:
            return
        group.approximate_memory.record(backend, chain, self.clock())
        if self.share is not None and self.share_decisions:
            self.share(Decision(self.replica, group.name, backend, KIND_ANSWER, time.time(), chain, 0, False))

    def _add_demand(self, backend: str, fresh: int, now: float, *, start: bool, age: float = 0.0) -> None:
        tokens = fresh + self.request_tokens
        self.demand.add(backend, tokens, now, age=age)
        if self.commitments is not None:
            self.commitments.record(backend, tokens, now, start=start, age=age)

    def _in_prefix_group(self, backend: str) -> bool:
        group = self.group_of.get(backend) or self.groups["*"]
        return group.mode == "prefix_key"

    def apply_remote(self, decision: Decision, *, restored: bool = False) -> None:
        """A decision another replica made: record it as if it were ours. `restored`: it comes
        from the route history (made before this process started, by any replica) and is
        recorded with its age, so what has expired since is not restored and its demand counts
        as much as is left of it; the sender's clock dates it (a date in the future is now)."""
        group = self.groups.get(decision.group)
        if group is None or decision.backend not in self.group_of:
            return
        now = self.clock()
        age = max(0.0, time.time() - decision.ts) if restored else 0.0
        if decision.kind != KIND_ANSWER:  # what an answer added is no request: no demand
            self._add_demand(decision.backend, decision.new_tokens, now, start=decision.start, age=age)
        if decision.kind == KIND_SPECULATIVE and group.mode == "precise":
            # the part of the chain the sender's (and so our) block index did not confirm yet
            group.memory.record(decision.backend, decision.keys, now, age)
        elif decision.kind in (KIND_APPROXIMATE, KIND_ANSWER):
            group.approximate_memory.record(decision.backend, decision.keys, now, age)

    @property
    def shares_tokenizations(self) -> bool:
        """Whether this replica exchanges `/tokenize` answers with the others."""
        return self.share_decisions and bool(self.remote)

    def share_tokenizations(self, offer: Callable[[Tokenized], None]) -> None:
        """Offer what each group without a local tokenizer learns from `/tokenize` to the other
        replicas (called once NATS is connected, when `shares_tokenizations`)."""
        for remote in self.remote.values():
            remote.share = offer

    def apply_tokenized(self, learnt: Tokenized, how: str = "shared") -> None:
        """What another replica learnt from `/tokenize`, remembered here (unknown group: ignored);
        `how`: `shared` live, `restored` from the route history."""
        remote = self.remote.get(learnt.group)
        if remote is not None:
            remote.apply_shared(learnt, how)

    def wipe(self, backend: str) -> None:
        """The backend's engine lost its cache (cleared, restarted): forget what we recorded."""
        group = self.group_of.get(backend)
        if group is None:
            return
        group.memory.wipe(backend)
        if group.fallback_memory is not None:
            group.fallback_memory.wipe(backend)

    async def settle(self) -> None:
        """Wait for the off-path `/tokenize` calls in flight (at shutdown, before the share is
        drained: what they learn is offered to the other replicas and the route history)."""
        for remote in self.remote.values():
            await remote.settle()

    async def aclose(self) -> None:
        for audit in self.audits.values():
            await audit.aclose()
        for remote in self.remote.values():
            await remote.aclose()

    def clear(self) -> None:
        self.demand.clear()
        if self.commitments is not None:
            self.commitments.clear()
        for remote in self.remote.values():
            remote.clear()
        for group in self.groups.values():
            group.memory.clear()
            if group.fallback_memory is not None:
                group.fallback_memory.clear()

    def recorded_entries(self) -> int:
        total = 0
        for group in self.groups.values():
            total += len(group.memory)
            if group.fallback_memory is not None:
                total += len(group.fallback_memory)
        return total


def _tie_key(keys: dict[str, RequestKeys]) -> int:
    """Spreads exact ties by the request's own keys: the deepest key of the first group (equal
    conversations tie the same way, different ones spread)."""
    for k in keys.values():
        if k.chain:
            return k.chain[-1] & 0xFFFF
    return 0
