"""`/admin/kv-index/*` (seed §"KV Cache Index" admin endpoints), mounted behind the admin token.

Each answer combines three views:

* the index and its feeds: in memory mode this process's embedded index (read directly); in
  redis mode one indexer replica's answer over NATS (`continuum.indexer.admin.<verb>`), and,
  when no indexer answers, the Redis index's own counts read directly (read-only);
* the listeners' heartbeats (KV bucket `continuum_listeners`): connection state of the engines'
  event streams, per backend;
* this ingress's own counters: routing decisions, index lookups, query latency, overlap scores,
  speculative entries.

The seed's fields come first and keep their meaning; the extra fields are documented in
docs/kv-scorer.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from continuum_common.kvindex import KvIndexError
from continuum_common.wire import indexer_admin
from continuum_ingress.policy.scorer import HoldingTier

if TYPE_CHECKING:
    from continuum_ingress.kv.component import KvRouting

DECISIONS = ("kv_aware", "placed", "fallback")


def iso_time(ts: object) -> str | None:
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts <= 0:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def heartbeat_source(hb: Mapping[str, Any]) -> dict[str, Any]:
    """A listener heartbeat as an `event_sources` entry of the seed's shape."""
    return {
        "backend_name": hb.get("backend"),
        "transport": "event_bus",
        "connected": bool(hb.get("connected")),
        "events_received": int(hb.get("events_received") or 0),
        "events_dropped": int(hb.get("events_dropped") or 0),
        "last_event_at": iso_time(hb.get("last_event_at")),
        "reconnect_count": int(hb.get("reconnects") or 0),
        "reporter": "listener",
        "listener": hb.get("listener"),
        "heartbeat_age_s": round(max(time.time() - float(hb.get("ts") or 0.0), 0.0), 1) if hb.get("ts") else None,
    }


def merge_backends(
    configured: Sequence[str],
    indexer_rows: Sequence[Mapping[str, Any]],
    heartbeats: Sequence[Mapping[str, Any]],
    kv_aware: Mapping[str, int],
) -> list[dict[str, Any]]:
    """One row per backend: events from the indexer, connection from the indexer (SSE sources)
    or else from the listener heartbeat, and this ingress's kv_aware decisions."""
    rows = {str(r.get("backend_name")): r for r in indexer_rows}
    beats = {str(h.get("backend")): h for h in heartbeats}
    names = list(dict.fromkeys([*configured, *sorted(rows), *sorted(beats)]))
    zero = {"received": 0, "dropped": 0, "applied": 0, "stale": 0, "index_created": 0, "index_evicted": 0, "clears": 0}
    out = []
    for name in names:
        row = rows.get(name, {})
        connection = row.get("connection")
        if connection is not None:
            connection = {**connection, "source": "indexer"}
        elif name in beats:
            hb = beats[name]
            connection = {
                "connected": bool(hb.get("connected")),
                "reconnect_count": int(hb.get("reconnects") or 0),
                "last_event_at": iso_time(hb.get("last_event_at")),
                "source": "listener",
            }
        out.append(
            {
                "backend_name": name,
                "connection": connection,
                "events": row.get("events", dict(zero)),
                "routing": {"kv_aware": int(kv_aware.get(name, 0))},
            }
        )
    return out


class KvAdminEndpoints:
    def __init__(self, kv: KvRouting) -> None:
        self.kv = kv

    def routes(self) -> list[Route]:
        return [
            Route("/kv-index/stats", self.stats, methods=["GET"]),
            Route("/kv-index/backends", self.backends, methods=["GET"]),
            Route("/kv-index/clear", self.clear, methods=["POST"]),
        ]

    # ---- the ingress's own numbers ---------------------------------------------------------

    def _sample(self, name: str, labels: dict[str, str] | None = None) -> int:
        value = self.kv.registry.get_sample_value(name, labels or {})
        return int(value or 0)

    def _decisions(self) -> dict[str, int]:
        out = {
            d: sum(
                self._sample("continuum_kv_index_routing_decisions_total", {"decision": d, "tier": t.value})
                for t in HoldingTier
            )
            for d in DECISIONS
        }
        return {**out, "total": sum(out.values())}

    # ---- the index's view ------------------------------------------------------------------

    async def _indexer_view(self, verb: str) -> tuple[dict[str, Any] | None, str]:
        """(the indexer-shaped answer, where it came from)."""
        kv = self.kv
        if kv.embedded is not None:
            index, sources = kv.embedded.index, kv.embedded.source_stats()
            if verb == "stats":
                body = indexer_admin.stats_body(kv.section, await index.stats(), sources, None, "ingress (embedded)")
            else:
                body = indexer_admin.backends_body(kv.section, await index.backend_counters(), sources)
            return body, "embedded"
        answer = await kv.bus.indexer(verb)
        if answer is not None and answer.get("success", True) is not False:
            return answer, "indexer"
        return None, "unavailable"

    async def stats(self, request: Request) -> Response:
        kv = self.kv
        section = kv.section
        view, origin = await self._indexer_view("stats")
        if view is not None:
            index = dict(view.get("index") or {})
        else:
            index = await self._direct_index_stats()
        counters = kv.prefix_scorer.counters
        index["total_hits"] = counters.hits
        blocks = await self._blocks_view(view)
        heartbeats = await kv.bus.heartbeats()
        sources = [heartbeat_source(h) for h in heartbeats]
        for s in (view or {}).get("event_sources") or []:
            sources.append({**s, "reporter": "indexer"})
        w = section.scoring
        body = {
            "enabled": section.enabled,
            "config": {
                "backend": section.backend,
                "max_entries": section.max_entries,
                "entry_ttl_seconds": section.entry_ttl_seconds,
                "event_sources_count": len(section.event_sources),
                "speculative_ttl_ms": section.speculative_ttl_ms,
                "scoring": {
                    "model": w.model,
                    "overlap_weight": w.overlap_weight,
                    "load_weight": w.load_weight,
                    "health_weight": w.health_weight,
                    "min_overlap_threshold": w.min_overlap_threshold,
                    "gpu_tier_weight": w.gpu_tier_weight,
                    "storage_tier_weight": w.storage_tier_weight,
                    "cost": w.cost.model_dump(),
                },
                "default_mode": section.default_mode,
                "groups": {g.name: g.mode for g in kv.selector.groups.values()},
            },
            "index": {
                "prefix_count": index.get("prefix_count"),
                "entry_count": index.get("entry_count"),
                "total_hits": index["total_hits"],
                "total_evictions": index.get("total_evictions"),
            },
            "event_sources": sources,
            "routing_decisions": self._decisions(),
            "query_latency_count": self._sample("continuum_kv_index_query_duration_seconds_count"),
            "overlap_score_count": self._sample("continuum_kv_index_overlap_score_count"),
            "lookups": {"total": counters.lookups, "hits": counters.hits, "errors": counters.errors},
            "speculative": {"entries": len(kv.speculative), "routes": counters.speculative_routes},
            "route_memory": {"entries": kv.selector.recorded_entries()},
            "blocks": blocks,
            "index_source": origin,
            "indexer": None
            if view is None or origin != "indexer"
            else {"replica": view.get("replica"), "consumer": view.get("consumer")},
        }
        return JSONResponse(body)

    async def _blocks_view(self, view: dict[str, Any] | None) -> Any:
        """The block index per backend: embedded (memory mode) or the indexer's (redis mode)."""
        if self.kv.embedded is None:
            return (view or {}).get("blocks")
        try:
            return indexer_admin.blocks_body(await self.kv.embedded.blocks.block_stats())
        except KvIndexError:
            return None

    async def _direct_index_stats(self) -> dict[str, Any]:
        """Redis mode with no indexer answering: the index's counts, read-only, if Redis is up."""
        if self.kv.redis_index is None:
            return {}
        try:
            s = await self.kv.redis_index.stats()
        except KvIndexError:
            return {}
        return {"prefix_count": s.prefix_count, "entry_count": s.entry_count, "total_evictions": s.total_evictions}

    async def backends(self, request: Request) -> Response:
        kv = self.kv
        view, origin = await self._indexer_view("backends")
        heartbeats = await kv.bus.heartbeats()
        rows = merge_backends(
            [b.name for b in kv.config.backends],
            (view or {}).get("backends") or [],
            heartbeats,
            kv.prefix_scorer.counters.kv_aware_by_backend + kv.selector.kv_aware_by_backend,
        )
        return JSONResponse({"enabled": kv.section.enabled, "backends": rows, "index_source": origin})

    async def clear(self, request: Request) -> Response:
        kv = self.kv
        if kv.embedded is not None:
            try:
                report = await kv.embedded.index.clear()
            except KvIndexError as exc:
                return _unavailable("index_unavailable", str(exc))
            kv.prefix_scorer.clear()
            kv.selector.clear()
            if kv.embedded is not None:
                await kv.embedded.blocks.clear_blocks()
            return JSONResponse({**indexer_admin.clear_body(report), "scope": "this ingress (embedded index)"})
        answer = await kv.bus.indexer("clear")
        if answer is None:
            return _unavailable("indexer_unavailable", "no continuum-indexer answered on NATS; nothing was cleared")
        if answer.get("success") is not True:
            return JSONResponse(answer, status_code=503)
        kv.prefix_scorer.clear()
        kv.selector.clear()
        return JSONResponse({**answer, "scope": "fleet (redis index)"})


def _unavailable(kind: str, message: str) -> Response:
    return JSONResponse({"success": False, "error": {"type": kind, "message": message}}, status_code=503)
