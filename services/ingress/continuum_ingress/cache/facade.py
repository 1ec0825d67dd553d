"""`ResponseCache`: the one object the ingress pipeline talks to (seed Tier 2 + Tier 3).

Per request:

    lookup = await cache.lookup(CacheRequest(route, body, headers))
    response headers += lookup.headers               # X-Cache: HIT|MISS|BYPASS (+ X-Cache-Mode)
    if lookup.response is not None:                  # HIT: answer without calling a backend
        replay lookup.response.status / .headers / .chunks()
    else:                                            # MISS or BYPASS: call the backend, and
        rec = cache.recorder(lookup)                 # None unless a MISS worth recording
        for each body chunk: send it to the client, then rec.feed(chunk)
        answer complete:       await rec.commit(status, headers)    (stores it if storable)
        error:                 rec.abort()
        client gone:           rec.abandon(status, headers)  (a whole stream is still stored)

(`await cache.store(lookup, status=, headers=, body=)` does the same for a whole body at once.)

Nothing here raises into the request path: store outages become misses (fallback.py), bad
entries become misses, and store/commit report False instead of raising.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from continuum_common.config.durations import format_duration
from continuum_common.hashing import CacheKeyError, response_cache_key
from continuum_common.logs import short_hash
from continuum_ingress.cache.errors import CacheError, EntryFormatError, InvalidateRequestError
from continuum_ingress.cache.fallback import FallbackCacheStore
from continuum_ingress.cache.memory import InMemoryCacheStore
from continuum_ingress.cache.metrics import CacheMetrics
from continuum_ingress.cache.policy.eligibility import (
    STREAM_DIALECTS,
    CachePolicy,
    Reason,
    is_stream,
    request_reason,
    response_storable,
)
from continuum_ingress.cache.policy.tenant import derive_tenant
from continuum_ingress.cache.protocol.entry import CachedResponse, EntryKind, decode_entry, encode_entry, keep_headers
from continuum_ingress.cache.protocol.sse import StreamRecorder
from continuum_ingress.cache.semantic import SemanticLayer, SemanticTicket
from continuum_ingress.cache.store import CacheStore, CacheStoreStats

if TYPE_CHECKING:
    from continuum_common.config.router import RouterConfig
    from continuum_common.redis_client import RedisClient

log = logging.getLogger(__name__)


class CacheStatus(StrEnum):
    HIT = "HIT"
    MISS = "MISS"
    BYPASS = "BYPASS"
    OFF = "OFF"  # response cache disabled: no X-Cache header, nothing counted


@dataclass(frozen=True, slots=True)
class CacheRequest:
    """`body`: the parsed JSON body as the client sent it (before any router-side rewrite);
    `headers`: the request headers, answering lower-case names (Starlette `Headers`)."""

    route: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """The answer of a lookup; also what the ingress's `ResponseCacheHook` returns (hooks.py).
    OFF: no cache ran (no X-Cache header); HIT carries the `response` to replay; a MISS
    carries what `recorder()` needs again (`key`, `route`, `stream`, `semantic`)."""

    status: CacheStatus
    response: CachedResponse | None = None
    reason: str = ""
    route: str = ""
    key: str | None = None
    stream: bool = False
    semantic: SemanticTicket | None = None
    # More response headers from the cache (a hook of another cache may add its own).
    extra_headers: tuple[tuple[str, str], ...] = ()

    @property
    def headers(self) -> dict[str, str]:
        """Headers to add to the client response."""
        if self.status is CacheStatus.OFF:
            return {}
        out = {"X-Cache": self.status.value}
        if self.response is not None and self.response.mode == "semantic":
            out["X-Cache-Mode"] = "semantic"
        out.update(self.extra_headers)
        return out


CACHE_OFF = CacheLookup(CacheStatus.OFF)


_OFF = CacheLookup(CacheStatus.OFF, reason=Reason.DISABLED)


# Streams stored after their client left (ResponseRecording.abandon), at once: each store is
# bounded by the store's own timeouts, and beyond this many the answer is not stored (counted).
MAX_LATE_COMMITS = 32


class Closable(Protocol):
    async def aclose(self) -> None: ...


class ResponseCache:
    def __init__(
        self,
        store: CacheStore,
        *,
        policy: CachePolicy,
        metrics: CacheMetrics,
        backend: str,
        capacity: int,
        semantic: SemanticLayer | None = None,
        owned: tuple[Closable, ...] = (),
    ) -> None:
        self.cache_store = store
        self.policy = policy
        self.metrics = metrics
        self.backend = backend
        self.capacity = capacity
        self.semantic = semantic
        self._owned = owned
        # The memory store is called synchronously: it saves a coroutine per lookup.
        self._memory = store if isinstance(store, InMemoryCacheStore) else None
        self.counts = {"hit": 0, "miss": 0, "skip": 0}
        self.semantic_hits = 0
        self._late: set[asyncio.Task[bool]] = set()
        # Set by factory.build_response_cache: applies a new configuration (hot reload).
        self.reloader: Callable[[ResponseCache, RouterConfig, RedisClient | None], None] | None = None

    @property
    def enabled(self) -> bool:
        """`response_cache.enabled` (hot-reloadable); when False, lookups return OFF at no cost."""
        return self.policy.enabled

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the Redis monitor task (if any). Call from the ingress lifespan."""
        if isinstance(self.cache_store, FallbackCacheStore):
            self.cache_store.start()

    async def aclose(self) -> None:
        # Stores of streams whose client left are finished first (each is bounded by the
        # store's timeouts), so closing the store does not fail them.
        if self._late:
            await asyncio.gather(*self._late, return_exceptions=True)
        if isinstance(self.cache_store, FallbackCacheStore):
            await self.cache_store.aclose()
        for resource in self._owned:
            await resource.aclose()

    async def __aenter__(self) -> ResponseCache:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def reload(self, cfg: RouterConfig, *, redis_client: RedisClient | None = None) -> None:
        """Hot reload: every `response_cache` field except `backend` (see factory.py)."""
        if self.reloader is None:
            raise CacheError("this ResponseCache was not built by build_response_cache; it cannot reload")
        self.reloader(self, cfg, redis_client)

    # request path ------------------------------------------------------------------------
    def _count(self, result: str) -> None:
        self.counts[result] += 1
        self.metrics.count_result(result)

    async def _get(self, key: str) -> CachedResponse | None:
        raw = self._memory.get_now(key) if self._memory is not None else await self.cache_store.get(key)
        if raw is None:
            return None
        try:
            return decode_entry(raw)
        except EntryFormatError as exc:
            log.warning("response cache: unreadable entry %s ignored (%s)", short_hash(key), exc)
            return None

    async def lookup(self, request: CacheRequest) -> CacheLookup:
        policy = self.policy
        body = request.body
        reason = request_reason(body, route=request.route, policy=policy)
        if reason is Reason.DISABLED:
            return _OFF
        if reason is not Reason.OK:
            self._count("skip")
            return CacheLookup(CacheStatus.BYPASS, reason=reason, route=request.route)
        stream = is_stream(body)
        tenant = derive_tenant(request.headers, policy.tenant_header)
        try:
            key = response_cache_key(body, tenant_id=tenant, route=request.route, stream=stream)
        except (CacheKeyError, KeyError):
            self._count("skip")
            return CacheLookup(CacheStatus.BYPASS, reason=Reason.UNKEYABLE, route=request.route)
        entry = await self._get(key)
        # The key already separates streams from whole responses; the kind check is a second lock.
        if entry is not None and entry.is_stream == stream and entry.status == 200:
            self._count("hit")
            return CacheLookup(CacheStatus.HIT, entry, route=request.route, key=key, stream=stream)
        ticket = None
        if self.semantic is not None and not stream:
            ticket = await self.semantic.prepare(body, route=request.route, tenant_id=tenant)
            if ticket is not None:
                hit = await self._semantic_hit(ticket)
                if hit is not None:
                    self._count("hit")
                    self.semantic_hits += 1
                    return CacheLookup(CacheStatus.HIT, hit, route=request.route, key=key)
        self._count("miss")
        return CacheLookup(CacheStatus.MISS, route=request.route, key=key, stream=stream, semantic=ticket)

    async def _semantic_hit(self, ticket: SemanticTicket) -> CachedResponse | None:
        assert self.semantic is not None
        match = self.semantic.match(ticket)
        if match is None:
            return None
        entry = await self._get("sem:" + match.entry_id)
        if entry is None or entry.is_stream or entry.status != 200:
            self.semantic.forget(ticket, match.entry_id)
            return None
        self.semantic.hits += 1
        return CachedResponse(
            entry.kind, entry.status, entry.headers, body=entry.body, created_at=entry.created_at, mode="semantic"
        )

    async def _put(self, key: str, data: bytes, ttl: float) -> bool:
        try:
            if self._memory is not None:
                self._memory.set_now(key, data, ttl)
            else:
                await self.cache_store.set(key, data, ttl)
        except (CacheError, ValueError) as exc:
            log.warning("response cache: store of %s failed (%s)", short_hash(key), type(exc).__name__)
            return False
        return True

    async def store(self, lookup: CacheLookup, *, status: int, headers: Mapping[str, str], body: bytes) -> bool:
        """Store a whole (non-stream) backend response after a MISS. True if stored."""
        if lookup.status is not CacheStatus.MISS or lookup.key is None or lookup.stream:
            return False
        if not response_storable(status, len(body), self.policy):
            return False
        entry = CachedResponse(EntryKind.RESPONSE, status, keep_headers(headers), body=body, created_at=time.time())
        return await self._store_entry(lookup, entry)

    async def _store_entry(self, lookup: CacheLookup, entry: CachedResponse) -> bool:
        assert lookup.key is not None
        data = encode_entry(entry)
        stored = await self._put(lookup.key, data, self.policy.ttl)
        ticket = lookup.semantic
        if (
            ticket is not None
            and not entry.is_stream
            and self.semantic is not None
            and await self._put(ticket.store_key, data, self.semantic.settings.ttl)
        ):
            self.semantic.remember(ticket)
        return stored

    def commit_later(self, recording: ResponseRecording, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """Store a whole answer whose request has already ended (its client left after the
        terminal event) in the background; skipped, and counted, when too many are pending."""
        if len(self._late) >= MAX_LATE_COMMITS:
            recording.abort("busy")
            self.metrics.count_late_commit("skipped")
            return
        task = asyncio.get_running_loop().create_task(recording.commit(status, headers))
        self._late.add(task)
        task.add_done_callback(self._late_done)

    def _late_done(self, task: asyncio.Task[bool]) -> None:
        self._late.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # commit returns False on store outages; anything else is a bug
        if error is not None:
            log.warning("response cache: a late store failed unexpectedly (%s)", type(error).__name__)
        self.metrics.count_late_commit("stored" if error is None and task.result() else "not_stored")

    def recorder(self, lookup: CacheLookup) -> ResponseRecording | None:
        """A recorder for the answer to a MISS (stream or whole body), or None when that
        answer could not be cached anyway."""
        if lookup.status is not CacheStatus.MISS or lookup.key is None:
            return None
        if not lookup.stream:
            return ResponseRecording(self, lookup, None)
        dialect = STREAM_DIALECTS.get(lookup.route)
        if dialect is None or not self.policy.stream_buffering:
            return None
        return ResponseRecording(self, lookup, StreamRecorder(dialect, self.policy.max_stream_buffer_size))

    # admin -------------------------------------------------------------------------------
    async def _store_stats(self) -> CacheStoreStats:
        try:
            return await self.cache_store.stats()
        except CacheError:
            return CacheStoreStats(backend=self.backend, entries=0, capacity=self.capacity, size_bytes=0, evictions=0)

    async def stats(self) -> dict[str, Any]:
        """The seed's `GET /admin/response-cache/stats` document (plus a `semantic` block)."""
        store_stats = await self._store_stats()
        hit, miss, skip = self.counts["hit"], self.counts["miss"], self.counts["skip"]
        looked_up = hit + miss
        doc: dict[str, Any] = {
            "enabled": self.policy.enabled,
            "backend_type": self.backend,
            "entries": store_stats.entries,
            "capacity": self.capacity,
            "requests": {"hit": hit, "miss": miss, "skip": skip, "total": hit + miss + skip},
            "hit_rate": f"{(hit / looked_up) if looked_up else 0.0:.4f}",
            "evictions": store_stats.evictions,
            "size_bytes": store_stats.size_bytes,
            "config": {
                "backend": self.backend,
                "ttl": format_duration(self.policy.ttl),
                "capacity": self.capacity,
                "max_response_size": self.policy.max_response_size,
                "max_stream_buffer_size": self.policy.max_stream_buffer_size,
            },
        }
        if isinstance(self.cache_store, FallbackCacheStore):
            doc["redis"] = self._redis_stats(self.cache_store)
        if self.semantic is not None:
            doc["semantic"] = {
                "enabled": True,
                "entries": len(self.semantic.index),
                "max_entries": self.semantic.index.max_entries,
                "partitions": self.semantic.index.partitions,
                "lookups": self.semantic.lookups,
                "hits": self.semantic.hits,
                "threshold": self.semantic.settings.threshold,
                "embedding_model": self.semantic.embedder.model,
            }
        return doc

    @staticmethod
    def _redis_stats(store: FallbackCacheStore) -> dict[str, Any]:
        primary = store.primary
        errors = getattr(primary, "errors", {})
        connections = getattr(primary, "connections", lambda: None)()
        return {
            "connections": connections or {"active": 0, "idle": 0},
            "fallback_active": store.fallback_active,
            "fallback_episodes": store.switches,
            "mode": store.mode,
            "fallback_entries": len(store.memory),
            "errors": {str(k): v for k, v in errors.items()} or {"connection": 0, "timeout": 0, "other": 0},
        }

    async def invalidate_all(self) -> dict[str, Any]:
        """`POST /admin/response-cache/invalidate {"clear_all": true}`: the seed's answer."""
        semantic_cleared = self.semantic.index.clear() if self.semantic is not None else 0
        error: str | None = None
        if isinstance(self.cache_store, FallbackCacheStore):
            result = await self.cache_store.clear_all()
            cleared, error = result.cleared, result.error
        else:
            cleared = await self.cache_store.clear()
        log.info("response cache: invalidated %d entries (%d semantic vectors)", cleared, semantic_cleared)
        doc: dict[str, Any] = {"success": error is None, "action": "clear_all", "cleared_entries": cleared}
        if error is not None:
            doc["error"] = error
        return doc

    async def invalidate(self, body: object) -> dict[str, Any]:
        """Validate an invalidate request body, then run it. Raises InvalidateRequestError
        (the ingress answers 400 with its message) for anything but `{"clear_all": true}`."""
        if not isinstance(body, Mapping):
            raise InvalidateRequestError("body must be a JSON object")
        unknown = sorted(set(body) - {"clear_all"})
        if unknown:
            raise InvalidateRequestError(f"unsupported field(s): {', '.join(unknown)}; only clear_all is supported")
        if body.get("clear_all") is not True:
            raise InvalidateRequestError('set "clear_all": true to clear the response cache')
        return await self.invalidate_all()


class ResponseRecording:
    """The answer to one MISS being recorded: fed the bytes sent to the client, committed once
    the answer is complete. `feed` never raises and never delays; whole bodies are kept up to
    `max_response_size`, streams up to `max_stream_buffer_size` (then the copy is dropped)."""

    def __init__(self, cache: ResponseCache, lookup: CacheLookup, stream: StreamRecorder | None) -> None:
        self._cache = cache
        self._lookup = lookup
        self.stream = stream
        self._limit = cache.policy.max_response_size
        self._parts: list[bytes] = []
        self._size = 0
        self.failure: str | None = None

    def feed(self, chunk: bytes) -> None:
        if self.failure is not None:
            return
        if self.stream is not None:
            self.stream.feed(chunk)
            return
        self._size += len(chunk)
        if self._size > self._limit:
            self.abort("oversized")
            return
        self._parts.append(chunk)

    def abort(self, reason: str = "interrupted") -> None:
        if self.failure is None:
            self.failure = reason
        self._parts = []
        if self.stream is not None:
            self.stream.abort(reason)

    def abandon(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """The request ended before the upstream's end (kept in the background when whole)."""
        stream = self.stream
        if self.failure is None and status == 200 and stream is not None and stream.complete:
            self._cache.commit_later(self, status, headers)
        else:
            self.abort()

    async def commit(self, status: int, headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> bool:
        """The whole answer reached the client: store it if it is storable. True if stored."""
        if self.failure is not None:
            return False
        key = self._lookup.key
        assert key is not None
        if status != 200:
            self.abort(f"status {status}")
            return False
        entry: CachedResponse | None
        if self.stream is not None:
            entry = self.stream.finish(status, headers)
            if entry is None:
                self.failure = self.stream.failure
        else:
            body = b"".join(self._parts)
            entry = CachedResponse(EntryKind.RESPONSE, status, keep_headers(headers), body=body, created_at=time.time())
        self.failure = self.failure or "committed"  # once only
        self._parts = []
        if entry is None:
            log.debug("response cache: answer %s not stored (%s)", short_hash(key), self.failure)
            return False
        return await self._cache._store_entry(self._lookup, entry)
