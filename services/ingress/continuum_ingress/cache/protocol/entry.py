"""Serialized cache entries: a versioned msgpack map.

    {"v": 1, "k": "r" | "s", "s": status, "h": [[name, value], ...], "t": created_at,
     "b": body}            # k = "r": a whole (non-stream) response
     "e": [event, ...]}    # k = "s": the raw bytes of every SSE event, terminators included

Only the headers in `STORED_HEADERS` are kept: a cached answer must not repeat per-request
headers (request ids, rate-limit counters, dates) of the response it was recorded from.
A stream entry replays as the concatenation of its events, which is byte for byte the stream
the backend sent. Decoding is strict: anything that is not exactly this shape (another
version, foreign data under our prefix, corruption) raises `EntryFormatError` and the caller
treats it as a miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import msgpack

from continuum_ingress.cache.errors import EntryFormatError

ENTRY_VERSION: Final = 1
STORED_HEADERS: Final = frozenset({"content-type"})


class EntryKind(StrEnum):
    RESPONSE = "r"
    STREAM = "s"


@dataclass(frozen=True, slots=True)
class CachedResponse:
    kind: EntryKind
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    events: tuple[bytes, ...] = ()
    created_at: float = 0.0
    # How the entry was found ("exact" or "semantic"); set on lookup, never stored.
    mode: str = field(default="exact", compare=False)

    @property
    def is_stream(self) -> bool:
        return self.kind is EntryKind.STREAM

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(e) for e in self.events)

    @property
    def content_type(self) -> str | None:
        for name, value in self.headers:
            if name == "content-type":
                return value
        return None

    def chunks(self) -> Iterator[bytes]:
        """The response body as the backend sent it: one chunk, or one chunk per SSE event."""
        if self.kind is EntryKind.STREAM:
            yield from self.events
        else:
            yield self.body


def keep_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((k.lower(), v) for k, v in items if k.lower() in STORED_HEADERS)


def encode_entry(entry: CachedResponse) -> bytes:
    doc: dict[str, Any] = {
        "v": ENTRY_VERSION,
        "k": entry.kind.value,
        "s": entry.status,
        "h": [list(h) for h in entry.headers],
        "t": entry.created_at,
    }
    if entry.kind is EntryKind.STREAM:
        doc["e"] = list(entry.events)
    else:
        doc["b"] = entry.body
    packed: bytes = msgpack.packb(doc, use_bin_type=True)
    return packed


def _fail(why: str) -> EntryFormatError:
    return EntryFormatError(f"not a response-cache entry: {why}")


def decode_entry(data: bytes) -> CachedResponse:
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, TypeError) as exc:
        raise _fail(type(exc).__name__) from None
    if not isinstance(doc, dict):
        raise _fail("not a map")
    if doc.get("v") != ENTRY_VERSION:
        raise _fail(f"version {doc.get('v')!r}")
    try:
        kind = EntryKind(doc["k"])
        status = doc["s"]
        raw_headers = doc["h"]
        created = doc.get("t", 0.0)
        if type(status) is not int or not isinstance(raw_headers, list) or type(created) not in (int, float):
            raise _fail("bad field types")
        headers = tuple((str(n), str(v)) for n, v in raw_headers)
        if kind is EntryKind.STREAM:
            events = doc["e"]
            if not isinstance(events, list) or not all(isinstance(e, bytes) for e in events):
                raise _fail("events must be a list of bytes")
            return CachedResponse(kind, status, headers, events=tuple(events), created_at=float(created))
        body = doc["b"]
        if not isinstance(body, bytes):
            raise _fail("body must be bytes")
        return CachedResponse(kind, status, headers, body=body, created_at=float(created))
    except (KeyError, ValueError, TypeError) as exc:
        raise _fail(type(exc).__name__) from None
