"""`streamGenerateContent?alt=sse` -> OpenAI chat completion chunks (provider-apis.md §1.6, §3.2).

Gemini sends `data: <GenerateContentResponse>` events, each with a usage snapshot (read the
last), the finish reason in the last, and no `[DONE]`. The OpenAI stream the SDK expects:

    data: {"object":"chat.completion.chunk", "choices":[{"delta":{"role":"assistant","content":""}}]}
    data: {... "delta":{"content":"Hi"} ...}                 (one per Gemini event and candidate)
    data: {... "delta":{"tool_calls":[{"index":0,"id":...,"function":{"name","arguments"}}]} ...}
    data: {... "delta":{}, "finish_reason":"stop"}
    data: {... "choices":[], "usage":{... "prompt_tokens_details":{"cached_tokens":N}}}   (include_usage)
    data: [DONE]

An error event (or an unreadable one) becomes one OpenAI `data: {"error": ...}` event, on which
the SDK raises; nothing is converted after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from continuum_common.sse import SseEvent
from continuum_ingress.gemini.protocol.chat_completion import (
    finish_reason,
    google_error_fields,
    openai_error,
    openai_usage,
    split_parts,
    tool_call,
)
from continuum_ingress.gemini.protocol.sse import SseConverter

DONE = b"data: [DONE]\n\n"


def frame(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ChatStreamConverter(SseConverter):
    """Stateful and pure: `feed(bytes) -> bytes` as the upstream stream arrives, `finish()` at its
    clean end. `usage` is the last usage snapshot seen (for accounting)."""

    def __init__(self, *, model: str, created: int, fallback_id: str, include_usage: bool) -> None:
        super().__init__()
        self.model = model
        self.created = created
        self.id = f"chatcmpl-{fallback_id}"
        self.include_usage = include_usage
        self.usage: Mapping[str, Any] | None = None
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self._calls: dict[int, int] = {}  # candidate index -> tool calls sent so far
        self._id_fixed = False

    def finish(self) -> bytes:
        if self.failed:
            return b""
        out = self._convert_rest()
        if self.failed:
            return out
        if self.include_usage and self.usage is not None:
            out += frame(self._chunk([], usage=openai_usage(self.usage)))
        return out + DONE

    # ------------------------------------------------------------------ events

    def _chunk(self, choices: list[dict[str, Any]], *, usage: Any = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = usage
        return chunk

    def _fail(self, code: int | None, status: str, message: str) -> bytes:
        self.failed = True
        return frame(openai_error(code, status, message))

    def _convert(self, event: SseEvent) -> bytes:
        data = event.data
        if data is None or data.strip() == "[DONE]":
            return b""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self._fail(None, "UNAVAILABLE", "The Gemini stream sent an unreadable event.")
        code, status, message = google_error_fields(obj)
        if not isinstance(obj, dict) or status or code is not None or "error" in obj:
            return self._fail(code, status, message or "The Gemini stream reported an error.")
        if not self._id_fixed and isinstance(obj.get("responseId"), str) and obj["responseId"]:
            self.id = f"chatcmpl-{obj['responseId']}"
        self._id_fixed = True
        if isinstance(obj.get("usageMetadata"), dict):
            self.usage = obj["usageMetadata"]
        candidates = obj.get("candidates")
        if not isinstance(candidates, list) or not candidates:
            feedback = obj.get("promptFeedback")
            if isinstance(feedback, dict) and feedback.get("blockReason") and 0 not in self._finished:
                self._finished.add(0)
                return self._role(0) + frame(self._chunk([self._delta(0, {}, "content_filter")]))
            return b""
        return b"".join(self._candidate(c, i) for i, c in enumerate(candidates) if isinstance(c, dict))

    def _delta(self, index: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def _role(self, index: int) -> bytes:
        if index in self._started:
            return b""
        self._started.add(index)
        return frame(self._chunk([self._delta(index, {"role": "assistant", "content": ""}, None)]))

    def _candidate(self, candidate: Mapping[str, Any], position: int) -> bytes:
        index = candidate["index"] if isinstance(candidate.get("index"), int) else position
        if index in self._finished:
            return b""
        content = candidate.get("content")
        text, calls = split_parts(content.get("parts") if isinstance(content, dict) else None)
        out = [self._role(index)]
        delta: dict[str, Any] = {}
        if text:
            delta["content"] = text
        if calls:
            sent = self._calls.get(index, 0)
            delta["tool_calls"] = [
                {"index": sent + n, **tool_call(p, f"call_{self.id[9:]}_{index}_{sent + n}")}
                for n, p in enumerate(calls)
            ]
            self._calls[index] = sent + len(calls)
        if delta:
            out.append(frame(self._chunk([self._delta(index, delta, None)])))
        reason = candidate.get("finishReason")
        if reason:
            self._finished.add(index)
            finish = finish_reason(reason, self._calls.get(index, 0) > 0)
            out.append(frame(self._chunk([self._delta(index, {}, finish)])))
        return b"".join(out)
