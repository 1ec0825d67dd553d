"""The backend selection pipeline (seed §"Backend 선택 파이프라인"):

    response cache hook (Tier 2)  ->  prefix key (Tier 1)  ->  KV scorer (Tier 4, when
    registered and the request has a prefix key or a token-id prompt; the seed's scorer decides
    only above 0.3)  ->  the configured selection_strategy (PrefixAwareHash = the CHWBL ring)

`lookup_cache()` runs once per request; `prepare()` computes the prefix key once; `choose()`
runs per attempt (a retry excludes the backends already tried). Every decision is recorded in
the RequestState and in the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection

from continuum_common.hashing import request_prefix_key
from continuum_common.ring import RouteLabel
from continuum_ingress.cache.facade import CACHE_OFF, CacheLookup
from continuum_ingress.errors import NoBackend
from continuum_ingress.hooks import NoResponseCache, RequestScorer, ResponseCacheHook
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.policy.scorer import BackendScorer, DecisionObserver, HoldingTier, best_scored
from continuum_ingress.policy.strategies import SelectionInput
from continuum_ingress.pool import BackendPool, BackendState
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.requests import prompt_token_ids
from continuum_ingress.response_affinity import ResponseAffinity
from continuum_ingress.snapshot import RouterSnapshot
from continuum_ingress.state import RequestState

log = logging.getLogger(__name__)

# APIs whose body has a system prompt / first message / prompt to anchor a prefix key.
PREFIX_APIS = frozenset({Api.CHAT, Api.COMPLETIONS, Api.MESSAGES})
SCORER_PREPARE_TIMEOUT_S = 0.1
SCORER_ERROR_LOG_INTERVAL_S = 1.0  # failures are all counted; the log gets at most one a second


class SelectionPipeline:
    def __init__(
        self,
        pool: BackendPool,
        metrics: IngressMetrics,
        *,
        response_cache: ResponseCacheHook | None = None,
        scorer: BackendScorer | RequestScorer | None = None,
        clock: Callable[[], float] = time.monotonic,
        scorer_timeout: float = SCORER_PREPARE_TIMEOUT_S,
        affinity: ResponseAffinity | None = None,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.response_cache: ResponseCacheHook = response_cache or NoResponseCache()
        # The Tier 4 scorer: a RequestScorer (kv/selector.py), or the seed's BackendScorer.
        self.selector = scorer if isinstance(scorer, RequestScorer) else None
        self.scorer: BackendScorer | None = None if isinstance(scorer, RequestScorer) else scorer
        self.observer = self.scorer if isinstance(self.scorer, DecisionObserver) else None
        self.clock = clock
        self.scorer_timeout = scorer_timeout
        self.affinity = affinity
        self._scorer_error_logged = float("-inf")

    async def lookup_cache(self, state: RequestState) -> CacheLookup:
        if not self.response_cache.enabled:
            return CACHE_OFF
        lookup = await self.response_cache.lookup(state)
        state.cache_headers = tuple(lookup.headers.items())
        return lookup

    def prepare(self, state: RequestState, snapshot: RouterSnapshot) -> None:
        """Compute the request's prefix key (Tier 1) once."""
        routing = snapshot.config.prefix_routing
        request = state.request
        if routing.enabled and request.key_api in PREFIX_APIS:
            state.prefix_key = request_prefix_key(
                request.key_body, enabled=True, max_prefix_length=routing.max_prefix_length
            )
            if state.prefix_key is not None:
                self.metrics.prefix_seen(state.prefix_key)

    def candidates(self, state: RequestState, snapshot: RouterSnapshot, exclude: Collection[str]) -> list[BackendState]:
        now = self.clock()
        out: list[BackendState] = []
        for name in snapshot.route(state.api, state.model):
            if name in exclude:
                continue
            backend = self.pool.get(name)
            if backend is not None and backend.eligible(now):
                out.append(backend)
        return out

    async def choose(
        self, state: RequestState, snapshot: RouterSnapshot, exclude: Collection[str] = ()
    ) -> BackendState:
        candidates = self.candidates(state, snapshot, exclude)
        if not candidates:
            raise NoBackend(f"No healthy backend is available for model '{state.model}'.")
        if self.affinity is not None and state.api is Api.RESPONSES:
            # A stored response lives in one engine: its owner comes before any scoring.
            owner = self.affinity.route(state, snapshot.config.response_affinity, candidates)
            if owner is not None:
                state.backend = owner.name
                state.route_label = None
                return owner
        keyed = state.prefix_key is not None or prompt_token_ids(state.request) is not None
        if self.selector is not None and keyed:
            picked = await self._selected(state, snapshot, candidates)
            if picked is not None:
                return picked
        elif self.scorer is not None and state.prefix_key is not None:
            picked = await self._scored(state, candidates)
            if picked is not None:
                return picked
        choice = snapshot.strategy.choose(candidates, SelectionInput(state.model, state.prefix_key, state.session_key))
        if choice.label is not None:
            self.metrics.route(choice.label)
            if self.observer is not None and state.prefix_key is not None and choice.label is not RouteLabel.FALLBACK:
                self.observer.note_decision(state.prefix_key, choice.backend, "prefix_hash")
        state.backend = choice.backend
        state.route_label = choice.label
        backend = self.pool.get(choice.backend)
        assert backend is not None  # candidates come from the pool
        if self.selector is not None and keyed:
            self.selector.note(state, backend, kv_aware=False)
        return backend

    async def _selected(
        self, state: RequestState, snapshot: RouterSnapshot, candidates: list[BackendState]
    ) -> BackendState | None:
        selector = self.selector
        assert selector is not None
        started = time.perf_counter()
        try:
            async with asyncio.timeout(selector.timeout_s):
                best = await selector.decide(state, snapshot, candidates)
        except Exception as exc:  # a scorer outage must never fail the request
            self._scorer_failed(exc)
            return None
        finally:
            self.metrics.kv_selection_seconds.observe(time.perf_counter() - started)
        if best is None:
            self.metrics.kv_decision("fallback", HoldingTier.NONE)
            return None
        self.metrics.kv_decision("placed" if best.placed else "kv_aware", best.tier, best.overlap)
        backend = self.pool.get(best.backend)
        assert backend is not None  # candidates come from the pool
        selector.note(state, backend, kv_aware=True)
        state.backend = best.backend
        state.route_label = None
        state.scorer_tier = best.tier
        state.scorer_score = best.overlap
        return backend

    def _scorer_failed(self, exc: BaseException) -> None:
        self.metrics.kv_scorer_errors.inc()
        now = self.clock()
        if now - self._scorer_error_logged >= SCORER_ERROR_LOG_INTERVAL_S:  # one line per outage second
            self._scorer_error_logged = now
            log.warning("KV scorer failed, using the selection strategy: %s", type(exc).__name__)

    async def _scored(self, state: RequestState, candidates: list[BackendState]) -> BackendState | None:
        assert self.scorer is not None and state.prefix_key is not None
        try:
            await asyncio.wait_for(self.scorer.prepare(state.prefix_key, candidates), self.scorer_timeout)
            best = best_scored(self.scorer, state.prefix_key, candidates)
        except Exception as exc:  # a scorer outage must never fail the request
            self._scorer_failed(exc)
            return None
        if best is None:
            self.metrics.kv_decision("fallback", HoldingTier.NONE)
            return None
        self.metrics.kv_decision("kv_aware", best.tier, best.score)
        if self.observer is not None:
            self.observer.note_decision(state.prefix_key, best.backend, "kv_aware")
        state.backend = best.backend
        state.route_label = None
        state.scorer_tier = best.tier
        state.scorer_score = best.score
        return self.pool.get(best.backend)
