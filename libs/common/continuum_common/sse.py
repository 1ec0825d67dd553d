"""One incremental splitter of server-sent-event byte streams (pure: bytes in, events out).

It follows the WHATWG event-stream rules:

* a line ends at CRLF, a lone CR or a lone LF, mixed freely; a CRLF cut between two chunks is
  one line end, not two (the CR ends the line at once, an LF starting the next chunk is
  skipped);
* a UTF-8 byte order mark at the start of the stream is skipped (also when cut between chunks);
* `field: value` with one optional space after the colon stripped; a line without a colon is a
  field with an empty value; a line starting with `:` is a comment;
* `data` lines are joined with LF; `event` names the event; `id` (without NUL) sets the last
  event id, which persists across events; `retry` and unknown fields are ignored;
* an event is dispatched at a blank line.

Every blank line yields an `SseEvent`, also one without data (WHATWG would not dispatch it):
callers that record streams need the raw bytes of every event, including keep-alive comments,
so the splitter hands them all over and callers that want only dispatchable events skip those
whose `data` is None. The raws of all events, then `close()`'s, give the stream back byte for
byte; where a chunk ended between the CR and the LF of an event's last line end, that LF opens
the next raw (`regroup` moves it back to its event).

Memory is bounded: the bytes of the event still waiting for its blank line (its lines with their
line ends, the unfinished line included) may not exceed `limit`;
exceeding it raises SseLimitError, after which the stream cannot be trusted and must be dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from continuum_common.errors import ContinuumError

DEFAULT_LIMIT: Final = 1 << 20
_BOM: Final = b"\xef\xbb\xbf"
_LINE_END: Final = re.compile(rb"[\r\n]")


class SseLimitError(ContinuumError, ValueError):
    """An SSE event grew past the splitter's byte limit before its blank line."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str | None  # the last `event` field's value, None without one
    data: str | None  # the `data` lines joined with LF, None without any `data` line
    id: str | None  # the last event id in effect when the event was dispatched
    raw: bytes  # the event's bytes as received, its blank line included


class SseSplitter:
    """Feed bytes, get complete events; a partial event waits for its blank line."""

    __slots__ = ("_data", "_event", "_head", "_id", "_line", "_raw", "_skip_lf", "last_event_id", "limit")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("the SSE limit must be positive")
        self.limit = limit
        self.last_event_id: str | None = None
        self._head: bytearray | None = bytearray()  # the stream's first bytes until the BOM is settled
        self._line = bytearray()  # the unfinished line
        self._skip_lf = False  # the last chunk ended in CR: an LF starting the next one is its pair
        self._raw = bytearray()  # the pending event's finished lines, with their line ends
        self._event: str | None = None
        self._data: list[bytes] | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if self._head is not None:
            chunk = self._skip_bom(chunk)
        if not chunk:  # an empty read must not forget that a CR may still get its LF
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:  # the second half of a CRLF cut between two chunks
                self._raw += b"\n"
                chunk = chunk[1:]
        events: list[SseEvent] = []
        start, size = 0, len(chunk)
        while True:
            match = _LINE_END.search(chunk, start)
            if match is None:
                break
            end = after = match.start()
            after += 1
            if chunk[end] == 0x0D:  # CR: with an LF after it, one line end
                if after == size:
                    self._skip_lf = True
                elif chunk[after] == 0x0A:
                    after += 1
            line = chunk[start:end]
            if self._line:
                line, self._line = bytes(self._line) + line, bytearray()
            event = self._line_done(line, chunk[end:after])
            if event is not None:
                events.append(event)
            start = after
        if start < size:
            self._line += chunk[start:]
            self._check(len(self._line))
        return events

    def close(self) -> SseEvent | None:
        """The end of the stream: the unfinished event, if any bytes of one are pending (WHATWG
        discards it; callers that tolerate a last event without its blank line use it)."""
        if self._head:  # fewer than three bytes, all a prefix of a BOM: they are content
            self._line += self._head
        self._head = None
        if self._line:
            line, self._line = bytes(self._line), bytearray()
            self._line_done(line, b"")
        if not self._raw:
            return None
        return self._dispatch()

    def _skip_bom(self, chunk: bytes) -> bytes:
        head = self._head
        assert head is not None
        head += chunk
        if len(head) < len(_BOM) and _BOM.startswith(head):
            return b""  # still undecided
        self._head = None
        self._raw += head[: len(_BOM)] if head.startswith(_BOM) else b""
        return bytes(head[len(_BOM) :] if head.startswith(_BOM) else head)

    def _check(self, pending_line: int) -> None:
        # A pending event never starts with LF unless it is the end of the previous event's CRLF
        # (cut between two chunks): that byte is not this event's.
        if len(self._raw) - self._raw.startswith(b"\n") + pending_line > self.limit:
            self._raw.clear()
            self._line.clear()
            raise SseLimitError(f"an SSE event exceeded {self.limit} bytes")

    def _line_done(self, line: bytes, end: bytes) -> SseEvent | None:
        self._raw += line
        self._raw += end
        if not line:
            return self._dispatch()
        self._check(0)
        if line[0] == 0x3A:  # ':' starts a comment
            return None
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\x00" not in value:
            self._id = value.decode("utf-8", "replace")
        return None

    def _dispatch(self) -> SseEvent:
        if self._id is not None:
            self.last_event_id, self._id = self._id, None
        data = None if self._data is None else b"\n".join(self._data).decode("utf-8", "replace")
        event = SseEvent(self._event, data, self.last_event_id, bytes(self._raw))
        self._raw.clear()
        self._event, self._data = None, None
        return event


def regroup(previous: bytes, raw: bytes) -> tuple[bytes, bytes]:
    """(previous, raw) with the LF that completes `previous`'s final CRLF moved back into it: an
    LF right after a CR is always that CR's pair, so the grouping no longer depends on where
    the chunks were cut."""
    if raw[:1] == b"\n" and previous[-1:] == b"\r":
        return previous + b"\n", raw[1:]
    return previous, raw
