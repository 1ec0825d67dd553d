"""Recording an upstream SSE stream for the cache, and replaying it.

`StreamRecorder` is fed the backend's bytes chunk by chunk *after* they were forwarded to the
client: it never holds them back and never changes them (it only keeps a copy). It splits the
bytes into SSE events with continuum_common.sse (an event ends at a blank line; CRLF, LF and CR
line ends are all legal per the SSE specification) and keeps each event's raw bytes. The recording is usable only if

* the dialect's terminal event arrived: `data: [DONE]` (OpenAI), `event: message_stop`
  (Anthropic) or `event: response.completed` / `response.incomplete` (OpenAI Responses), and
  nothing but blank lines followed it;
* no error event was seen: a `data:` JSON object with a top-level `error` key (OpenAI),
  `event: error` (Anthropic, Responses) or `event: response.failed` (Responses);
* the whole stream fits `max_bytes` (the recorder drops its copy as soon as it does not);
* the caller did not `abort()` it (client gone, upstream failure, timeout).

Replay (`CachedResponse.chunks()`) yields the stored events one by one; their concatenation is
exactly the recorded stream, so the same chunks, ids and usage reach the client.
Gemini streams have no terminal event (they end when the connection closes), so they are not
recorded: a stream cut short would be indistinguishable from a complete one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Final

import orjson

from continuum_common.sse import SseEvent, SseLimitError, SseSplitter, regroup
from continuum_ingress.cache.protocol.entry import CachedResponse, EntryKind, keep_headers


class SseDialect(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    RESPONSES = "responses"


# Named events that end a stream, and those that spoil it, for the dialects that name events.
_TERMINAL: Final = {
    SseDialect.ANTHROPIC: frozenset({"message_stop"}),
    SseDialect.RESPONSES: frozenset({"response.completed", "response.incomplete"}),
}
_FAILED: Final = {
    SseDialect.ANTHROPIC: frozenset({"error"}),
    SseDialect.RESPONSES: frozenset({"error", "response.failed"}),
}


_ERROR_MARK: Final = '"error"'


def _is_openai_error(data: str) -> bool:
    if _ERROR_MARK not in data:  # cheap pre-check: most chunks never mention it
        return False
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and "error" in doc


class StreamRecorder:
    def __init__(
        self,
        dialect: SseDialect,
        max_bytes: int,
        *,
        status: int = 200,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    ) -> None:
        self.dialect = dialect
        self.max_bytes = max_bytes
        self._status = status
        self._headers = keep_headers(headers)
        self._splitter = SseSplitter(max(max_bytes, 1))  # never reached: the stream is smaller
        self._events: list[bytes] = []
        self._size = 0
        self._terminal = False
        self.failure: str | None = None

    @property
    def size(self) -> int:
        return self._size

    @property
    def complete(self) -> bool:
        """The terminal event arrived and nothing spoiled the recording."""
        return self._terminal and self.failure is None

    def abort(self, reason: str = "interrupted") -> None:
        if self.failure is None:
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self._events = []

    def feed(self, chunk: bytes) -> None:
        """Take a copy of `chunk` (already sent on to the client). Never raises."""
        if self.failure is not None:
            return
        self._size += len(chunk)
        if self._size > self.max_bytes:
            self._fail("oversized")
            return
        try:
            events = self._splitter.feed(chunk)
        except SseLimitError:
            self._fail("oversized")
            return
        for event in events:
            self._event(event)
            if self.failure is not None:
                return

    def _event(self, event: SseEvent) -> None:
        raw = event.raw
        if self._events:  # one stored event per SSE event, however the chunks were cut
            self._events[-1], raw = regroup(self._events[-1], raw)
            if not raw:
                return
        if self._terminal:
            if raw.strip():
                self._fail("data after the terminal event")
            else:
                self._events[-1] += raw  # stray blank lines: keep them, replay stays identical
            return
        self._events.append(raw)
        if self.dialect is SseDialect.OPENAI:
            if event.data == "[DONE]":
                self._terminal = True
            elif event.data is not None and _is_openai_error(event.data):
                self._fail("error event")
        elif event.event in _TERMINAL[self.dialect]:
            self._terminal = True
        elif event.event in _FAILED[self.dialect]:
            self._fail("error event")

    def finish(
        self, status: int | None = None, headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None
    ) -> CachedResponse | None:
        """Call at the end of the upstream body (status/headers override the constructor's).
        Returns the entry to store, or None."""
        if status is not None:
            self._status = status
        if headers is not None:
            self._headers = keep_headers(headers)
        if self.failure is None:
            # Tolerate a final event without its blank line: end of body ends the event.
            rest = self._splitter.close()
            if rest is not None:
                self._event(rest)
        if not self.complete:
            if self.failure is None:
                self._fail("no terminal event")
            return None
        return CachedResponse(
            EntryKind.STREAM, self._status, self._headers, events=tuple(self._events), created_at=time.time()
        )
