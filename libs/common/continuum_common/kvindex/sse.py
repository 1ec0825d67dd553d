"""The seed-compatible SSE transport of KV events, pure parts: the KV view of the shared SSE
splitter with the seed's 1 MiB limit, and the mapping of one SSE record to a normalized KvEvent.

Wire shape (the listener's `GET /events/{backend}`; push-mode bytes are identical):

    id: 1712:42
    event: cache_created
    data: {"event": "cache_created", "prefix_hash": "<64 hex>", "token_count": 2048, "tier": "gpu_hot"}

* The event type comes from the SSE `event:` field first, the JSON `event` (or `type`) only
  when the field is absent (seed). `cache_` prefixes are accepted (`cache_created` = `created`).
* Ordering stamp: the JSON's `source_epoch` + `seq` when present (the listener's normalized
  event), else an `id:` of the form `<epoch>:<seq>` or `<backend>:<epoch>:<seq>`, else the
  consumer's arrival stamp (docs/kv-index.md explains what that means for replicas).
* A record still waiting for its blank line (its lines, so the line buffer and the accumulated
  `data:`) is capped at 1 MiB; exceeding it raises SseLimitError and the consumer disconnects,
  backs off and resumes from the last event id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from continuum_common.errors import ContinuumError
from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.sse import SseLimitError, SseSplitter

__all__ = ["MAX_SSE_BUFFER_SIZE", "SseError", "SseEventError", "SseLimitError", "SseParser", "SseRecord"]

MAX_SSE_BUFFER_SIZE = 1 << 20  # the seed's MAX_SSE_BUFFER_SIZE: bounds the line and the data
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_STAMP_ID = re.compile(r"(?:[A-Za-z0-9_-]{1,64}:)?(\d{1,20}):(\d{1,20})")
_TYPES = {t.value: t for t in EventType} | {"all_blocks_cleared": EventType.CLEARED}
_TIERS = {
    "gpu_hot": Tier.GPU_HOT,
    "gpuhot": Tier.GPU_HOT,
    "gpu": Tier.GPU_HOT,
    "storage_warm": Tier.STORAGE_WARM,
    "storagewarm": Tier.STORAGE_WARM,
    "storage": Tier.STORAGE_WARM,
    "warm": Tier.STORAGE_WARM,
}
# Stream-control records a listener may send; none of them is a KV event.
CONTROL_EVENTS = frozenset({"ping", "heartbeat", "keepalive", "hello", "draining", "buffer_overflow"})
# After these the server closes the stream: reconnect (draining: at once; overflow: resume).
CLOSING_EVENTS = frozenset({"draining", "buffer_overflow"})


class SseError(ContinuumError):
    """Base of the SSE transport's errors (SseLimitError, from continuum_common.sse, is the
    other one a consumer meets)."""


class SseEventError(SseError, ValueError):
    """A record is not a valid KV event (counted and dropped; the stream goes on)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SseRecord:
    event: str | None
    data: str
    id: str | None  # the last event id in effect when this record was dispatched


class SseParser:
    """The KV transport's view of continuum_common.sse: only records with data, and the seed's
    1 MiB bound on a pending record."""

    def __init__(self, max_buffer: int = MAX_SSE_BUFFER_SIZE) -> None:
        self._splitter = SseSplitter(max_buffer)

    @property
    def last_event_id(self) -> str | None:
        return self._splitter.last_event_id

    @last_event_id.setter
    def last_event_id(self, value: str | None) -> None:  # resuming: records before the first id carry it
        self._splitter.last_event_id = value

    def feed(self, chunk: bytes) -> list[SseRecord]:
        return [SseRecord(e.event or None, e.data, e.id) for e in self._splitter.feed(chunk) if e.data is not None]


def record_type(record: SseRecord, body: dict[str, Any] | None) -> str:
    """The record's type name, lower-case: the SSE `event:` field first, then the JSON body."""
    name = record.event
    if not name and body is not None:
        value = body.get("event", body.get("type"))
        name = value if isinstance(value, str) else None
    return (name or "message").strip().lower()


def parse_body(record: SseRecord) -> dict[str, Any] | None:
    try:
        body = orjson.loads(record.data)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 1 << 64:
        raise SseEventError("invalid", f"{name} must be a non-negative 64-bit integer")
    return value


def _stamp(body: dict[str, Any], record: SseRecord) -> tuple[int, int] | None:
    epoch, seq = _int_field(body, "source_epoch"), _int_field(body, "seq")
    if epoch is not None and seq is not None:
        return epoch, seq
    match = _STAMP_ID.fullmatch(record.id or "")
    if match:
        epoch, seq = int(match[1]), int(match[2])
        if epoch < 1 << 64 and seq < 1 << 64:  # 20 digits reach past uint64: not our stamp then
            return epoch, seq
    return None


def record_to_event(
    record: SseRecord, body: dict[str, Any] | None, *, backend: str, arrival: tuple[int, int], now: float
) -> KvEvent:
    """Map one SSE record (not a control record) of source `backend` to a KvEvent.
    `arrival` is the stamp to use when the record carries none. Raises SseEventError."""
    if body is None:
        raise SseEventError("invalid", "data is not a JSON object")
    name = record_type(record, body)
    etype = _TYPES.get(name.removeprefix("cache_"))
    if etype is None:
        raise SseEventError("unknown_type", "unknown event type")
    claimed = body.get("backend", body.get("backend_name"))
    if claimed is not None and claimed != backend:
        raise SseEventError("backend_mismatch", "event names another backend than its source")
    prefix_hash = body.get("prefix_hash")
    if etype is EventType.CLEARED:
        prefix_hash = None
    elif not isinstance(prefix_hash, str) or not _HEX64.fullmatch(prefix_hash):
        raise SseEventError("invalid", "prefix_hash must be 64 hex characters")
    else:
        prefix_hash = prefix_hash.lower()
    tokens = _int_field(body, "token_count") or 0
    tier_name = body.get("tier", body.get("storage_tier"))
    tier = Tier.GPU_HOT
    if tier_name is not None:
        found = _TIERS.get(str(tier_name).lower()) if isinstance(tier_name, str) else None
        if found is None:
            raise SseEventError("invalid", "unknown tier")
        tier = found
    epoch, seq = _stamp(body, record) or arrival
    ts = body.get("ts")
    when = float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else now
    return KvEvent(backend, epoch, seq, when, etype, prefix_hash, tokens, tier)
