"""Server-sent-event framing of normalized KV events (seed "SSE 파싱 세부사항").

Each event is one record:

    id: <source_epoch>-<seq>
    event: cache_created | cache_updated | cache_evicted | cache_offloaded | cache_cleared
    data: {"event": <same>, "v": 1, "backend": ..., "source_epoch": ..., "seq": ...,
           "ts": ..., "type": ..., "prefix_hash": ..., "token_count": ..., "tier": ...}

The seed's consumer reads the `event:` field first and the JSON `event` key second, so both
carry the name. Stream control records (`buffer_overflow`, `draining`) have no id, so a consumer
resumes from the last real event.
"""

from __future__ import annotations

import orjson

from continuum_common.events import EventType, KvEvent

SSE_NAMES: dict[EventType, str] = {
    EventType.CREATED: "cache_created",
    EventType.UPDATED: "cache_updated",
    EventType.EVICTED: "cache_evicted",
    EventType.OFFLOADED: "cache_offloaded",
    EventType.CLEARED: "cache_cleared",
}
BUFFER_OVERFLOW = "buffer_overflow"
DRAINING = "draining"


def event_id(epoch: int, seq: int) -> str:
    return f"{epoch}-{seq}"


def parse_event_id(value: str | None) -> tuple[int, int] | None:
    """(epoch, seq) of a Last-Event-ID header, None when absent or not ours."""
    if not value:
        return None
    epoch, sep, seq = value.strip().partition("-")
    if not sep or not epoch.isdigit() or not seq.isdigit():
        return None
    return int(epoch), int(seq)


def encode_event(event: KvEvent, *, with_id: bool = True) -> bytes:
    name = SSE_NAMES[event.type]
    data = orjson.dumps({"event": name, **event.to_dict()})
    head = f"id: {event_id(event.source_epoch, event.seq)}\n" if with_id else ""
    return f"{head}event: {name}\ndata: ".encode() + data + b"\n\n"


def encode_control(name: str, reason: str) -> bytes:
    data = orjson.dumps({"event": name, "reason": reason})
    return f"event: {name}\ndata: ".encode() + data + b"\n\n"


def encode_comment(text: str) -> bytes:
    return f": {text}\n\n".encode()
