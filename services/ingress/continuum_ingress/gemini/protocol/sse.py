"""The chunking half of the Gemini stream converters: server-sent events split into whole events
by continuum_common.sse, whatever the TCP chunking (Gemini separates events with CRLF CRLF,
OpenAI-style servers with LF LF; the SSE specification lets every line end be CR, LF or CRLF,
mixed)."""

from __future__ import annotations

from continuum_common.sse import SseEvent, SseLimitError, SseSplitter

# One event larger than this is not a sane answer (bounded buffer).
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SseConverter:
    """Bytes in, whole events to `_convert`, converted bytes out. A subclass converts one event
    and says how it fails; after a failure (an oversized event, or a Google error in the stream)
    it emits nothing more."""

    def __init__(self) -> None:
        self.failed = False
        self._splitter = SseSplitter(MAX_EVENT_BYTES)

    def _convert(self, event: SseEvent) -> bytes:
        raise NotImplementedError

    def _fail(self, code: int | None, status: str, message: str) -> bytes:
        raise NotImplementedError

    def feed(self, data: bytes) -> bytes:
        if self.failed:
            return b""
        try:
            events = self._splitter.feed(data)
        except SseLimitError:
            return self._fail(None, "UNAVAILABLE", "The Gemini stream sent an oversized event.")
        return b"".join(self._convert(e) for e in events if e.data is not None)

    def _convert_rest(self) -> bytes:
        """The last, unterminated event at the end of the stream."""
        event = self._splitter.close()
        return self._convert(event) if event is not None and event.data is not None else b""
