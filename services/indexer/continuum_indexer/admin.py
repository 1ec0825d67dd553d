"""Admin answers (pure composition of index stats, counters and source states into the seed's
JSON shapes); adapters/admin_nats.py serves them over NATS request/reply."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from continuum_common.config.router import KvCacheIndex
from continuum_common.kvindex import BackendCounters, BlockIndexStats, ClearReport, IndexStats
from continuum_indexer.stats import SourceStats


def stats_body(
    cfg: KvCacheIndex,
    stats: IndexStats,
    sources: Sequence[SourceStats],
    consumer: Mapping[str, Any] | None,
    replica: str,
    *,
    blocks: BlockIndexStats | None = None,
) -> dict[str, Any]:
    body = {
        "enabled": cfg.enabled,
        "config": {
            "backend": stats.backend,
            "max_entries": cfg.max_entries,
            "entry_ttl_seconds": cfg.entry_ttl_seconds,
            "key_prefix": cfg.key_prefix,
            "event_sources_count": len(cfg.event_sources),
            "storage_offloading": {
                "enabled": cfg.storage_offloading.enabled,
                "treat_eviction_as_offload": cfg.storage_offloading.treat_eviction_as_offload,
            },
        },
        "index": {
            "prefix_count": stats.prefix_count,
            "entry_count": stats.entry_count,
            "total_evictions": stats.total_evictions,
        },
        "event_sources": [s.to_json() for s in sources],
        "consumer": dict(consumer) if consumer is not None else None,
        "replica": replica,
    }
    if blocks is not None:
        body["blocks"] = blocks_body(blocks)
    return body


def blocks_body(stats: BlockIndexStats, age_offset_s: float = 0.0) -> dict[str, Any]:
    """The block index per backend; `age_offset_s` is added to each last-batch age (a snapshot
    taken that long ago)."""
    backends = {}
    for name, b in sorted(stats.backends.items()):
        age = b.last_batch_age_s
        backends[name] = {
            "gpu_blocks": b.gpu_blocks,
            "storage_blocks": b.storage_blocks,
            "source_epoch": b.source_epoch,
            "last_batch_age_s": None if age is None else round(age + age_offset_s, 3),
            "generation": b.generation,
            "batches": b.batches,
            "applied": b.applied,
            "stale": b.stale,
            "stale_batches": b.stale_batches,
            "clears": b.clears,
            "evicted": b.evicted,
        }
    return {"block_count": stats.block_count, "backends": backends}


def backends_body(
    cfg: KvCacheIndex, counters: Mapping[str, BackendCounters], sources: Sequence[SourceStats]
) -> dict[str, Any]:
    by_name = {s.backend_name: s for s in sources}
    names = sorted(set(counters) | {s.backend_name for s in cfg.event_sources})
    rows = []
    for name in names:
        c = counters.get(name, BackendCounters())
        source = by_name.get(name)
        rows.append(
            {
                "backend_name": name,
                "connection": (
                    {
                        "connected": source.connected,
                        "reconnect_count": source.reconnect_count,
                        "last_event_at": source.to_json()["last_event_at"],
                    }
                    if source is not None
                    else None  # bus-fed backends: see the listener heartbeats
                ),
                "events": {
                    "received": c.received,
                    "dropped": c.dropped,
                    "applied": c.applied,
                    "stale": c.stale,
                    "index_created": c.index_created,
                    "index_evicted": c.index_evicted,
                    "clears": c.clears,
                },
            }
        )
    return {"enabled": cfg.enabled, "backends": rows}


def clear_body(report: ClearReport, cleared_blocks: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "success": True,
        "entries_before_clear": report.entries_before_clear,
        "cleared_entries": report.cleared_entries,
    }
    if cleared_blocks is not None:
        body["cleared_blocks"] = cleared_blocks
    return body


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"success": False, "error": {"type": kind, "message": message}}
