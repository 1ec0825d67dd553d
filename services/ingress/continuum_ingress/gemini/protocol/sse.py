"""Server-sent events split into whole events, whatever the TCP chunking (Gemini separates events
with CRLF CRLF, OpenAI-style servers with LF LF; the SSE specification lets every line end be
CR, LF or CRLF, mixed)."""

from __future__ import annotations

import re

# An event ends at two line ends in a row. A lone CR is a line end only when no LF follows.
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LINE = re.compile(rb"\r\n|\n|\r")
# One event larger than this is not a sane answer (bounded buffer).
MAX_EVENT_BYTES = 16 * 1024 * 1024


class EventTooLarge(ValueError):
    """An SSE event grew past MAX_EVENT_BYTES without ending."""


def _uniform_separator(buffer: bytes) -> bytes | None:
    """The event separator when every line end in `buffer` is LF, or every one is CRLF; None
    when they are mixed (or CR), which takes the general scan."""
    crs = buffer.count(b"\r")
    if not crs:
        return b"\n\n"
    if crs == buffer.count(b"\n") == buffer.count(b"\r\n"):
        return b"\r\n\r\n"
    return None


class SseSplitter:
    """Feed bytes, get complete events (without their separator); a partial event waits."""

    __slots__ = ("_buffer", "_limit")

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._buffer = b""
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data if self._buffer else data
        events: list[bytes] = []
        start = 0
        # A CR at the very end may be the first half of a CRLF: it waits for the next byte.
        end = len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)
        separator = _uniform_separator(buffer)
        while True:
            if separator:  # a memchr-speed scan: what every real server sends
                at = buffer.find(separator, start, end)
                if at < 0:
                    break
                events.append(buffer[start:at])
                start = at + len(separator)
            else:
                match = _EVENT_END.search(buffer, start, end)
                if match is None:
                    break
                events.append(buffer[start : match.start()])
                start = match.end()
        self._buffer = buffer[start:]
        if len(self._buffer) > self._limit:
            self._buffer = b""
            raise EventTooLarge(f"an SSE event exceeded {self._limit} bytes")
        return events

    def rest(self) -> bytes:
        """What is left when the stream ends (an event without its final blank line)."""
        rest, self._buffer = self._buffer, b""
        return rest


def event_data(event: bytes) -> bytes | None:
    """The `data:` payload of one event (multi-line data joined with LF), None without one."""
    if event.startswith(b"data: ") and b"\n" not in event and b"\r" not in event:
        return event[6:]  # the usual one-line event
    lines = [line for line in _LINE.split(event) if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[6:] if line.startswith(b"data: ") else line[5:] for line in lines)


class SseConverter:
    """The chunking half of a Gemini-stream converter: bytes in, whole events to `_convert`,
    converted bytes out. A subclass converts one event and says how it fails; after a failure
    (an oversized event, or a Google error in the stream) it emits nothing more."""

    def __init__(self) -> None:
        self.failed = False
        self._splitter = SseSplitter()

    def _convert(self, event: bytes) -> bytes:
        raise NotImplementedError

    def _fail(self, code: int | None, status: str, message: str) -> bytes:
        raise NotImplementedError

    def feed(self, data: bytes) -> bytes:
        if self.failed:
            return b""
        try:
            events = self._splitter.feed(data)
        except EventTooLarge:
            return self._fail(None, "UNAVAILABLE", "The Gemini stream sent an oversized event.")
        return b"".join(self._convert(e) for e in events)

    def _convert_rest(self) -> bytes:
        """The last, unterminated event at the end of the stream."""
        return self._convert(self._splitter.rest())
