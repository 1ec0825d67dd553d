"""The indexer's admin over NATS request/reply: subjects, the answers' JSON shapes and their codecs
(pure, no I/O).

Requests go to `continuum.indexer.admin.<verb>` with the body `{}`, verb one of `stats`,
`backends`, `clear`; every indexer replica subscribes in one queue group, so one replica answers.
The answers are JSON objects in the seed's shapes (docs/kv-index.md): `stats_body`,
`backends_body`, `clear_body`, or `error_body` (`"success": false`). The ingress builds the same
shapes from the KV index it feeds itself (`kv_cache_index.backend: memory`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.kvindex import BackendCounters, BlockIndexStats, ClearReport, IndexStats

ADMIN_SUBJECT_PREFIX: Final = "continuum.indexer.admin."
ADMIN_SUBJECT_WILDCARD: Final = ADMIN_SUBJECT_PREFIX + "*"
VERBS: Final = ("stats", "backends", "clear")
REQUEST_BODY: Final = b"{}"


def subject_for(verb: str) -> str:
    return ADMIN_SUBJECT_PREFIX + verb


def verb_of(subject: str) -> str:
    """The verb of a request's subject (empty when the subject is not an admin subject)."""
    return subject[len(ADMIN_SUBJECT_PREFIX) :] if subject.startswith(ADMIN_SUBJECT_PREFIX) else ""


def encode_reply(body: Mapping[str, Any]) -> bytes:
    return orjson.dumps(body)


def decode_reply(data: bytes) -> dict[str, Any] | None:
    """An answer as a JSON object, or None when it is not one (raises orjson.JSONDecodeError on
    bytes that are not JSON)."""
    body = orjson.loads(data)
    return body if isinstance(body, dict) else None


@dataclass(slots=True)
class SourceStats:
    """One SSE event source's connection state, as an `event_sources` entry of the answers."""

    backend_name: str
    transport: str
    connected: bool = False
    events_received: int = 0
    events_dropped: int = 0
    reconnect_count: int = 0
    last_event_at: float | None = None  # wall clock seconds

    def saw_events(self, count: int) -> None:
        self.events_received += count
        self.last_event_at = time.time()

    def to_json(self) -> dict[str, Any]:
        last = None
        if self.last_event_at is not None:
            last = datetime.fromtimestamp(self.last_event_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "backend_name": self.backend_name,
            "transport": self.transport,
            "connected": self.connected,
            "events_received": self.events_received,
            "events_dropped": self.events_dropped,
            "last_event_at": last,
            "reconnect_count": self.reconnect_count,
        }


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
