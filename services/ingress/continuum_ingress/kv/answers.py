"""The answer an OpenAI chat completion gave, read from the bytes the client received (pure;
used by kv/remote_tokens.py, docs/kv-scorer.md "Remembered tokenizations").

Why: the next turn of a conversation starts with this turn's messages *and its answer*, and the
engine that generated the answer holds it in its KV cache. Knowing the answer's tokens before
the next turn arrives lets that turn be matched through the answer without a `/tokenize` call
on its path.

`AnswerReader` is fed the body as it reaches the client (SSE chunks of a stream, or the whole
JSON body) and gives the text a client replays as `{"role": "assistant", "content": text}`, or
None when the answer cannot be replayed that way: more than one choice, tool or function calls,
an error event, a stream without its `data: [DONE]`, malformed JSON, or more than `max_bytes`.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from continuum_common.sse import SseLimitError, SseSplitter

MAX_ANSWER_BYTES: Final = 256 * 1024  # a longer answer is not learnt (nor buffered)
_CALLS: Final = ("tool_calls", "function_call")


class AnswerReader:
    """Collects one chat completion's assistant text; `text()` once the response is complete."""

    __slots__ = ("_body", "_done", "_failed", "_parts", "_size", "_splitter", "max_bytes", "stream")

    def __init__(self, *, stream: bool, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.stream = stream
        self.max_bytes = max_bytes
        self._splitter = SseSplitter(limit=max_bytes) if stream else None
        self._body = bytearray()
        self._parts: list[str] = []
        self._size = 0
        self._done = False
        self._failed = False

    def feed(self, chunk: bytes) -> None:
        if self._failed:
            return
        if self._splitter is None:
            self._body += chunk
            if len(self._body) > self.max_bytes:
                self._fail()
            return
        try:
            events = self._splitter.feed(chunk)
        except SseLimitError:
            self._fail()
            return
        for event in events:
            if event.data is not None and not self._failed:
                self._delta(event.data)

    def text(self) -> str | None:
        """The answer's text, or None when it cannot be replayed as a plain assistant message."""
        if self._failed:
            return None
        if self._splitter is None:
            return _whole_text(bytes(self._body))
        return "".join(self._parts) if self._done else None

    def _fail(self) -> None:
        self._failed = True
        self._parts = []
        self._body = bytearray()
        self._splitter = None

    def _delta(self, data: str) -> None:
        if data == "[DONE]":
            self._done = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._fail()
            return
        if not isinstance(chunk, dict) or "error" in chunk:
            self._fail()
            return
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            self._fail()
            return
        for choice in choices:  # a usage-only chunk has none
            content = _choice_part(choice, "delta")
            if content is None:
                self._fail()
                return
            self._size += len(content)
            if self._size > self.max_bytes:
                self._fail()
                return
            if content:
                self._parts.append(content)


def _choice_part(choice: Any, field: str) -> str | None:
    """The text of one choice's `delta` / `message` ("" when it has none), or None when the
    choice makes the answer unusable (another choice, a tool call)."""
    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
        return None
    if choice.get("finish_reason") in _CALLS:
        return None
    part = choice.get(field)
    if part is None:
        return ""
    if not isinstance(part, dict) or any(part.get(name) for name in _CALLS):
        return None
    content = part.get("content")
    if content is None:
        return ""
    return content if isinstance(content, str) else None


def _whole_text(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    choices = doc.get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        return None
    return _choice_part(choices[0], "message")
