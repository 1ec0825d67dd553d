"""The seed-compatible SSE transport of KV events, pure parts: an incremental SSE parser with
the seed's 1 MiB limits, and the mapping of one SSE record to a normalized KvEvent.

Wire shape (the listener's `GET /events/{backend}`; push-mode bytes are identical):

    id: 1712:42
    event: cache_created
    data: {"event": "cache_created", "prefix_hash": "<64 hex>", "token_count": 2048, "tier": "gpu_hot"}

* The event type comes from the SSE `event:` field first, the JSON `event` (or `type`) only
  when the field is absent (seed). `cache_` prefixes are accepted (`cache_created` = `created`).
* Ordering stamp: the JSON's `source_epoch` + `seq` when present (the listener's normalized
  event), else an `id:` of the form `<epoch>:<seq>` or `<backend>:<epoch>:<seq>`, else the
  consumer's arrival stamp (docs/kv-index.md explains what that means for replicas).
* Line buffer and accumulated `data:` are each capped at 1 MiB; exceeding either raises
  SseLimitError and the consumer disconnects, backs off and resumes from the last event id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from continuum_common.errors import ContinuumError
from continuum_common.events import EventType, KvEvent, Tier

MAX_SSE_BUFFER_SIZE = 1 << 20  # the seed's MAX_SSE_BUFFER_SIZE, for the line and for data
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
    """Base of the SSE transport's errors."""


class SseLimitError(SseError):
    """A line or a record's data exceeded MAX_SSE_BUFFER_SIZE: the stream must be dropped."""


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
    """Incremental parser of an SSE byte stream (WHATWG rules: CR, LF or CRLF line ends,
    `field: value`, comments, `data` lines joined with LF, `id` persisting across records)."""

    def __init__(self, max_buffer: int = MAX_SSE_BUFFER_SIZE) -> None:
        self.max_buffer = max_buffer
        self.last_event_id: str | None = None
        self._line = bytearray()
        self._skip_lf = False
        self._event: str | None = None
        self._data: list[str] = []
        self._data_size = 0

    def feed(self, chunk: bytes) -> list[SseRecord]:
        records: list[SseRecord] = []
        if not chunk:  # an empty read must not forget that a CR may still get its LF
            return records
        start = 0
        if self._skip_lf and chunk[:1] == b"\n":
            start = 1
        self._skip_lf = False
        size = len(chunk)
        while start < size:
            cr = chunk.find(b"\r", start)
            lf = chunk.find(b"\n", start)
            ends = [p for p in (cr, lf) if p >= 0]
            if not ends:
                self._line += chunk[start:]
                if len(self._line) > self.max_buffer:
                    raise SseLimitError(f"SSE line longer than {self.max_buffer} bytes")
                break
            end = min(ends)
            self._line += chunk[start:end]
            if len(self._line) > self.max_buffer:
                raise SseLimitError(f"SSE line longer than {self.max_buffer} bytes")
            record = self._line_done(bytes(self._line))
            self._line.clear()
            if record is not None:
                records.append(record)
            start = end + 1
            if chunk[end : end + 1] == b"\r":
                if start < size and chunk[start : start + 1] == b"\n":
                    start += 1
                elif start == size:
                    self._skip_lf = True
        return records

    def _line_done(self, raw: bytes) -> SseRecord | None:
        if not raw:
            return self._dispatch()
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data_size += len(value) + 1
            if self._data_size > self.max_buffer:
                raise SseLimitError(f"SSE data larger than {self.max_buffer} bytes without a record end")
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self.last_event_id = value
        return None  # `retry` and unknown fields are ignored

    def _dispatch(self) -> SseRecord | None:
        event, data = self._event, self._data
        self._event, self._data, self._data_size = None, [], 0
        if not data:
            return None
        return SseRecord(event=event or None, data="\n".join(data), id=self.last_event_id)


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
