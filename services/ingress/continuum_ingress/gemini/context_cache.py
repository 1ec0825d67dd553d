"""The ingress half of the Gemini context cache (seed "Gemini Context Cache", docs/gemini-cache.md).

For each attempt of a chat request on a `type: gemini` backend (a BodyRewriter):

1. eligibility (policy.cache_candidate; the backend needs a key of its own);
2. digest = SHA-256 of model + whole system prompt (continuum_common's Gemini digest);
3. lookup: the local memo (`lookup_memo_ms`), else the gemini-cache service over NATS within
   `lookup_timeout_ms` (concurrent lookups of one key share one request; no answer = miss);
4. hit: the body names the cache (`extra_body.google.cached_content`) and loses its system
   prompt; miss: the body goes as is, at once, and an ensure is published (unless a create is
   already in flight); negative or ineligible: as is.

The decision is kept in `state.extras` for the dialect (usage accounting) and for the
stale-reference resend (a RejectionHandler): when Google rejects the reference (403/404, or a
400 about the CachedContent: `gemini_api.is_stale_cache_reference`), the forwarder resends the
original body once, and a drop is published for the entry.

Outcomes and cached tokens go to a UsageAccumulator sent on `continuum.gemini.usage` every
`usage_interval_s` (acknowledged by the service; a lost report is counted), and to this
ingress's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from continuum_common.config import Backend, RouterConfig
from continuum_common.config.router import GeminiContextCacheConfig
from continuum_common.gemini_api import is_stale_cache_reference
from continuum_common.wire.gemini import (
    SUBJECT_DROP,
    SUBJECT_ENSURE,
    DropRequest,
    EnsureRequest,
    LookupReply,
    LookupRequest,
    LookupResult,
    RequestOutcome,
    UsageAccumulator,
    digest_hex,
)
from continuum_ingress.gemini.adapters.bus import GeminiBus
from continuum_ingress.gemini.memo import LookupMemo, MemoKey
from continuum_ingress.gemini.metrics import GeminiMetrics
from continuum_ingress.gemini.policy import Candidate, Ineligible, cache_candidate
from continuum_ingress.gemini.protocol.compat import with_cached_content
from continuum_ingress.protocol.apis import Api
from continuum_ingress.snapshot import RouterSnapshot
from continuum_ingress.state import RequestState

log = logging.getLogger(__name__)

EXTRAS_KEY = "gemini"
USAGE_INTERVAL_S = 1.0
MAX_LOOKUPS_IN_FLIGHT = 1024
STALE_STATUSES = frozenset({400, 403, 404})


@dataclass(slots=True)
class CacheDecision:
    """What the context cache decided for one attempt on one backend."""

    backend: str
    outcome: RequestOutcome
    digest: str | None = None
    cached_content: str | None = None
    token_count: int | None = None
    # The body before the reference was injected: what a stale-reference resend sends.
    original: dict[str, Any] | None = None
    resent: bool = False

    @property
    def hit(self) -> bool:
        return self.outcome is RequestOutcome.HIT and not self.resent


def decision_for(state: RequestState, backend: str) -> CacheDecision | None:
    decision = state.extras.get(EXTRAS_KEY)
    return decision if isinstance(decision, CacheDecision) and decision.backend == backend else None


class GeminiContextCache:
    """BodyRewriter + RejectionHandler + Component + the usage sink of the Gemini dialect."""

    def __init__(
        self,
        config: GeminiContextCacheConfig,
        bus: GeminiBus,
        metrics: GeminiMetrics,
        *,
        usage_interval_s: float = USAGE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.bus = bus
        self.metrics = metrics
        self.memo = LookupMemo(config.lookup_memo_ms / 1000, clock=clock)
        self.usage = UsageAccumulator()
        self._usage_interval = usage_interval_s
        self._lookups: dict[MemoKey, asyncio.Future[LookupReply | None]] = {}
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ Component

    async def start(self) -> None:
        await self.bus.start()
        self._task = asyncio.create_task(self._usage_loop(), name="gemini-usage")

    def reload(self, config: RouterConfig) -> None:
        """gemini_context_cache is restart-only; backends are read from each request's snapshot."""

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.publish_usage()
        await self.bus.aclose()

    async def _usage_loop(self) -> None:
        while True:
            await asyncio.sleep(self._usage_interval)
            await self.publish_usage()

    async def publish_usage(self) -> None:
        """Send what was counted since the last report (a lost report is counted by the bus)."""
        report = self.usage.drain()
        if report is not None:
            self.metrics.messages.labels("usage").inc()
            await self.bus.send_usage(report)

    # ------------------------------------------------------------------ BodyRewriter

    async def rewrite(
        self, state: RequestState, snapshot: RouterSnapshot, backend: Backend, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        if backend.type != "gemini" or state.api is not Api.CHAT:
            return None
        decision = await self._decide(state, snapshot, backend, body)
        state.extras[EXTRAS_KEY] = decision
        self.usage.record(backend.name, decision.outcome)
        self.metrics.outcome(backend.name, decision.outcome)
        if decision.outcome is RequestOutcome.HIT and decision.cached_content is not None:
            decision.original = body
            return with_cached_content(body, decision.cached_content)
        return None

    async def _decide(
        self, state: RequestState, snapshot: RouterSnapshot, backend: Backend, body: dict[str, Any]
    ) -> CacheDecision:
        found = cache_candidate(body, self.config.min_prefix_bytes, self.bus.max_payload)
        if isinstance(found, Candidate) and snapshot.api_keys.get(backend.name) is None:
            found = Ineligible.NO_KEY
        if not isinstance(found, Candidate):
            self.metrics.ineligible.labels(found.value).inc()
            return CacheDecision(backend.name, RequestOutcome.INELIGIBLE)
        model = state.model
        digest = digest_hex(model, found.system)
        reply = await self._lookup((backend.name, digest), model)
        if reply is None or reply.result is LookupResult.MISS:
            if reply is None or not reply.in_flight:
                self._ensure(backend.name, model, found.system, digest)
            return CacheDecision(backend.name, RequestOutcome.MISS, digest)
        if reply.result is LookupResult.NEGATIVE:
            return CacheDecision(backend.name, RequestOutcome.NEGATIVE, digest)
        return CacheDecision(backend.name, RequestOutcome.HIT, digest, reply.cached_content, reply.token_count)

    async def _lookup(self, key: MemoKey, model: str) -> LookupReply | None:
        memo = self.memo.get(key)
        if memo is not None:
            self.metrics.lookups.labels("memo").inc()
            return memo
        pending = self._lookups.get(key)
        if pending is not None:  # the same prefix is being looked up: share that answer
            self.metrics.lookups.labels("shared").inc()
            return await asyncio.shield(pending)
        if len(self._lookups) >= MAX_LOOKUPS_IN_FLIGHT:
            self.metrics.lookup_failure("overloaded")
            return None
        future: asyncio.Future[LookupReply | None] = asyncio.get_running_loop().create_future()
        self._lookups[key] = future
        try:
            self.metrics.lookups.labels("bus").inc()
            reply = await self.bus.lookup(LookupRequest(key[0], model, key[1]))
            if reply is not None:
                self.memo.put(key, reply, self._memo_ttl(reply))
            future.set_result(reply)
            return reply
        except BaseException:
            future.set_result(None)
            raise
        finally:
            del self._lookups[key]

    @staticmethod
    def _memo_ttl(reply: LookupReply) -> float | None:
        """A hit is not remembered past its expiry (the service already keeps a margin)."""
        if reply.result is LookupResult.HIT and reply.expire_at is not None:
            return max(0.0, reply.expire_at - time.time())
        return None

    def _ensure(self, backend: str, model: str, system: str, digest: str) -> None:
        request = EnsureRequest(backend, model, digest, system)
        if self.bus.publish(SUBJECT_ENSURE, request.to_bytes(), "ensure"):
            self.metrics.messages.labels("ensure").inc()
            # Requests for this prefix until the memo expires need not ask (or ensure) again.
            self.memo.put((backend, digest), LookupReply(LookupResult.MISS, in_flight=True))

    # ------------------------------------------------------------------ RejectionHandler

    def wants_body(self, state: RequestState, backend: Backend, status: int) -> bool:
        decision = decision_for(state, backend.name)
        return decision is not None and decision.hit and status in STALE_STATUSES

    def retry_body(self, state: RequestState, backend: Backend, status: int, body: bytes) -> dict[str, Any] | None:
        decision = decision_for(state, backend.name)
        if decision is None or not decision.hit or decision.original is None:
            return None
        try:
            parsed: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and len(parsed) == 1:  # some Google front ends wrap errors in a list
            parsed = parsed[0]
        if not is_stale_cache_reference(status, parsed):
            return None
        decision.resent = True
        self.metrics.stale.labels(backend.name).inc()
        assert decision.digest is not None and decision.cached_content is not None
        self.memo.forget((backend.name, decision.digest))
        drop = DropRequest(backend.name, decision.digest, decision.cached_content)
        if self.bus.publish(SUBJECT_DROP, drop.to_bytes(), "drop"):
            self.metrics.messages.labels("drop").inc()
        log.info(
            "backend %s rejected cache %s (HTTP %d): resending without it", backend.name, decision.digest[:12], status
        )
        return decision.original

    # ------------------------------------------------------------------ usage sink (the dialect)

    def cached_tokens(self, backend: str, tokens: int) -> None:
        if tokens > 0:
            self.usage.add_cached_tokens(backend, tokens)
            self.metrics.cached_tokens.labels(backend).inc(tokens)

    # ------------------------------------------------------------------ admin

    async def stats(self) -> dict[str, Any]:
        await self.publish_usage()  # so the answer includes this replica's latest request counts
        stats = await self.bus.stats()
        stats["ingress"] = {"memo_entries": len(self.memo), "bus_connected": self.bus.connected}
        return stats

    async def clear(self) -> dict[str, Any]:
        reply = await self.bus.clear()
        self.memo.clear()
        return reply.to_json()
