"""The answer a chat request got (an OpenAI chat completion, an Anthropic Messages response or
an OpenAI Responses answer), read from the bytes the client received (no I/O;
used by kv/remote_tokens.py and kv/selector.py, docs/kv-scorer.md "Remembered tokenizations"
and "Approximate").

Why: the next turn of a conversation starts with this turn's messages *and its answer*, and the
engine that generated the answer holds it in its KV cache. Knowing the answer's tokens before
the next turn arrives lets that turn be matched through the answer without a `/tokenize` call
on its path.

`AnswerReader` is fed the body as it reaches the client (SSE chunks of a stream, or the whole
JSON body) and gives the text a client replays as `{"role": "assistant", "content": text}`, or
None when the answer cannot be replayed that way: more than one choice, tool or function calls,
an error event, a stream without its end (`data: [DONE]`, Anthropic's `message_stop`),
malformed JSON, or more than `max_bytes`. An Anthropic answer is read the same way: its text
blocks joined with newlines (as a replayed content array is read, `content_text`), and any
other block (`tool_use`, `thinking`, ...) makes it unusable. A Responses answer is read from
its final response object (`response.completed` or `.incomplete`, or the whole body): one assistant message
item, its `output_text` parts joined with newlines as a replayed item is read
(continuum_common.hashing.responses_input); reasoning items are left out as they are on replay,
and any other item (a function call, a built-in tool call) makes it unusable.
`AnswerRecorder` is the `ResponseRecorder` (hooks.ANSWER_RECORDER) around it that hands the
answer, or None, to its owner exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import orjson

from continuum_ingress.protocol.apis import Api

MAX_ANSWER_BYTES: Final = 256 * 1024  # a longer answer is not learnt (nor buffered)
_CALLS: Final = ("tool_calls", "function_call")
_BOM: Final = b"\xef\xbb\xbf"
# (request API, API its keys follow) of the requests whose answers are read: OpenAI chat
# completions, Anthropic Messages, and Responses requests that carry their whole conversation
# (read as chat; one that continues a stored response has no keys of its own).
_READ: Final = frozenset({(Api.CHAT, Api.CHAT), (Api.MESSAGES, Api.MESSAGES), (Api.RESPONSES, Api.CHAT)})
# A Responses stream is read only at its end: the events that end it, and errors. A line
# without one of these is not parsed (most lines are text deltas).
_RESPONSES_ENDS: Final = (b"response.completed", b"response.failed", b"response.incomplete", b'"error"')
# The events that carry a final answer: an incomplete one (cut at `max_output_tokens`) is still
# replayed with the text it has, as a chat completion cut at `max_tokens` is.
_RESPONSES_DONE: Final = frozenset({"response.completed", "response.incomplete"})
# Anthropic stream events that carry nothing the replayed message depends on.
_QUIET_EVENTS: Final = frozenset({"message_start", "content_block_stop", "ping"})


def reads_answers(api: Api, key_api: Api) -> bool:
    """Whether a request's answer can be read and replayed by its next turn: a chat request,
    or a Responses request that resends its whole conversation."""
    return (api, key_api) in _READ


class AnswerReader:
    """Collects one chat completion's assistant text; `text()` once the response is complete.

    It runs on the event loop for every chunk of every stream, so a stream is read line by
    line with bytes methods, not with a general SSE parser: OpenAI-style streams put each
    chunk's JSON on one `data:` line. An event whose data spans several lines does not parse
    as JSON and makes the answer unusable (never a wrong text)."""

    __slots__ = ("_blocks", "_body", "_done", "_failed", "_parts", "_size", "api", "max_bytes", "stream")

    def __init__(self, *, stream: bool, api: Api = Api.CHAT, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.stream = stream
        self.api = api  # the answer's shape: Api.CHAT, Api.MESSAGES or Api.RESPONSES
        self.max_bytes = max_bytes
        self._blocks = 0  # Anthropic content blocks begun
        self._body = bytearray()  # a whole body, or a stream's unfinished line
        self._parts: list[str] = []
        self._size = 0
        self._done = False
        self._failed = False

    def feed(self, chunk: bytes) -> None:
        if self._failed:
            return
        if not self.stream:
            self._body += chunk
            if len(self._body) > self.max_bytes:
                self._fail()
            return
        if self._body:
            self._body += chunk
            data = bytes(self._body)
            self._body.clear()
        elif not self._parts and chunk.startswith(_BOM):  # the stream's first bytes
            data = chunk[len(_BOM) :]
        else:
            data = chunk
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the chunk ended with its line
        for line in lines:
            if line.startswith(b"data:") and not self._failed:
                self._data(line[5:].strip())
        if tail and not self._failed:
            if len(tail) > self.max_bytes:
                self._fail()
            else:
                self._body += tail

    def text(self) -> str | None:
        """The answer's text, or None when it cannot be replayed as a plain assistant message."""
        if self._failed:
            return None
        if not self.stream:
            body = bytes(self._body)
            if self.api is Api.MESSAGES:
                return _whole_message_text(body)
            return _whole_response_text(body) if self.api is Api.RESPONSES else _whole_text(body)
        return "".join(self._parts) if self._done else None

    def _fail(self) -> None:
        self._failed = True
        self._parts = []
        self._body = bytearray()

    def _add(self, text: str) -> None:
        self._size += len(text)
        if self._size > self.max_bytes:
            self._fail()
        else:
            self._parts.append(text)

    def _data(self, data: bytes) -> None:
        if self.api is Api.RESPONSES:
            self._responses_event(data)
            return
        if data == b"[DONE]" and self.api is Api.CHAT:
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
        if self.api is Api.MESSAGES:
            self._event(chunk)
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
            if content:
                self._add(content)
                if self._failed:
                    return

    def _event(self, event: dict[str, Any]) -> None:
        """One event of an Anthropic Messages stream."""
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta")
            text = delta.get("text") if isinstance(delta, dict) and delta.get("type") == "text_delta" else None
            if isinstance(text, str):
                self._add(text)
            else:  # input_json_delta, thinking_delta, ...: not a plain text answer
                self._fail()
        elif kind == "content_block_start":
            block = event.get("content_block")
            text = block.get("text", "") if isinstance(block, dict) and block.get("type") == "text" else None
            if not isinstance(text, str):
                self._fail()
                return
            if self._blocks:
                self._add("\n")  # replayed text blocks are read joined with newlines
            self._blocks += 1
            if text:
                self._add(text)
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
                self._fail()
        elif kind == "message_stop":
            self._done = True
        elif kind not in _QUIET_EVENTS:  # an error event, or one this reader does not know
            self._fail()

    def _responses_event(self, data: bytes) -> None:
        """One event of a Responses stream: only its end is read, the whole answer at once."""
        if self._done or not any(end in data for end in _RESPONSES_ENDS):
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._fail()
            return
        kind = event.get("type") if isinstance(event, dict) else None
        if kind in _RESPONSES_DONE:
            text = _responses_output_text(event.get("response"))
            if text is None:
                self._fail()
                return
            self._add(text)
            self._done = True
        elif kind in ("response.failed", "error") or not isinstance(kind, str):
            self._fail()


class AnswerRecorder:
    """Reads the answer the forwarder feeds it and calls `on_answer` once: with the text when
    the answer was whole and usable, else with None. `settle(None)` ends it early (the owner's
    request ended without an answer); later calls do nothing."""

    __slots__ = ("on_answer", "reader")

    def __init__(self, *, stream: bool, on_answer: Callable[[str | None], None], api: Api = Api.CHAT) -> None:
        self.on_answer = on_answer
        self.reader: AnswerReader | None = AnswerReader(stream=stream, api=api)

    def feed(self, chunk: bytes) -> None:
        if self.reader is not None:
            self.reader.feed(chunk)

    async def commit(self, status: int, headers: Sequence[tuple[str, str]]) -> object:
        reader = self.reader
        self.settle(reader.text() if reader is not None and status < 300 else None)
        return None

    def abort(self) -> None:
        # An answer cut short is not what the client replays. A stream whose `[DONE]` went out
        # is whole, though (the reader saw its end), whatever broke afterwards.
        reader = self.reader
        self.settle(reader.text() if reader is not None and reader.stream else None)

    def abandon(self, status: int, headers: Sequence[tuple[str, str]]) -> None:
        # Clients often close the connection on `[DONE]`, before the upstream's end reaches
        # the ingress: the request then ends cancelled with a whole answer.
        reader = self.reader
        self.settle(reader.text() if reader is not None and reader.stream and status < 300 else None)

    def settle(self, text: str | None) -> None:
        if self.reader is None:
            return
        self.reader = None
        self.on_answer(text)


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


def _whole_message_text(body: bytes) -> str | None:
    """The text of a whole Anthropic Messages response: its text blocks joined with newlines."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != "message" or doc.get("stop_reason") == "tool_use":
        return None
    blocks = doc.get("content")
    if not isinstance(blocks, list):
        return None
    texts: list[str] = []
    for block in blocks:
        text = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else None
        if not isinstance(text, str):
            return None
        texts.append(text)
    return "\n".join(texts)


def _whole_response_text(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _responses_output_text(doc)


def _responses_output_text(response: Any) -> str | None:
    """The text of a completed Responses answer: its one assistant message item's `output_text`
    parts joined with newlines; None for anything its replay would not read as that message."""
    if not isinstance(response, dict) or response.get("status") not in ("completed", "incomplete"):
        return None
    output = response.get("output")
    if not isinstance(output, list):
        return None
    texts: list[str] | None = None
    for item in output:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "reasoning":  # left out of the replayed conversation, as here
            continue
        if kind != "message" or item.get("role") != "assistant" or texts is not None:
            return None
        parts = item.get("content")
        if not isinstance(parts, list):
            return None
        texts = []
        for part in parts:
            text = part.get("text") if isinstance(part, dict) and part.get("type") == "output_text" else None
            if not isinstance(text, str):
                return None  # a refusal, or a part the replay does not read as text
            texts.append(text)
    return None if texts is None else "\n".join(texts)
