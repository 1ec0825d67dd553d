"""Response bodies of the fake Gemini server, built from provider-apis.md §1 (pure functions).

Token counts are deterministic: one token per started 4 UTF-8 bytes of text, so a test can
size a system prompt to land just above or below a model's minimum.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from continuum_common.gemini_api import bare_model


def count_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


def parts_text(content: Any) -> str:
    """Text of one Content (`{"parts": [{"text": …}]}`) or of a bare string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Mapping):
        return ""
    parts = content.get("parts")
    if not isinstance(parts, list):
        return ""
    return "".join(p["text"] for p in parts if isinstance(p, Mapping) and isinstance(p.get("text"), str))


def contents_text(contents: Any) -> str:
    if not isinstance(contents, list):
        return parts_text(contents)
    return "".join(parts_text(c) for c in contents)


def google_error(code: int, message: str, status: str, details: list[Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        err["details"] = details
    return {"error": err}


STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

TOO_SMALL = "Cached content is too small. total_token_count={total}, min_total_token_count={minimum}"
NOT_FOUND = "CachedContent not found (or permission denied)"
CACHE_CONFLICT = (
    "CachedContent can not be used with GenerateContent request setting system_instruction, tools or "
    "tool_config.\n\nProposed fix: move those values to CachedContent from GenerateContent request."
)
MODEL_MISMATCH = "Model used by GenerateContent request ({request}) and CachedContent ({cached}) has to be the same."
KEY_INVALID = "API key not valid. Please pass a valid API key."
NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)


def key_invalid_body() -> dict[str, Any]:
    return google_error(
        400,
        KEY_INVALID,
        "INVALID_ARGUMENT",
        [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
        ],
    )


@dataclass(frozen=True, slots=True)
class Usage:
    prompt: int
    cached: int
    candidates: int

    def metadata(self) -> dict[str, Any]:
        """Gemini `usageMetadata`; `cachedContentTokenCount` only when something was cached."""
        out: dict[str, Any] = {
            "promptTokenCount": self.prompt,
            "candidatesTokenCount": self.candidates,
            "totalTokenCount": self.prompt + self.candidates,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": self.prompt}],
        }
        if self.cached:
            out["cachedContentTokenCount"] = self.cached
            out["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": self.cached}]
        return out

    def openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.candidates,
            "total_tokens": self.prompt + self.candidates,
        }
        if self.cached:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return out


@dataclass(frozen=True, slots=True)
class Reply:
    """What the fake model answers: text pieces (one per stream chunk) or a function call."""

    pieces: tuple[str, ...]
    truncated: bool
    function_call: Mapping[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def tokens(self) -> int:
        if self.function_call is not None:
            return count_tokens(orjson.dumps(self.function_call).decode())
        return count_tokens(self.text)


def make_reply(text: str, max_tokens: int | None, function_call: Mapping[str, Any] | None = None) -> Reply:
    """Split `text` into word pieces; cut it at `max_tokens` (finish reason MAX_TOKENS)."""
    if function_call is not None:
        return Reply((), False, function_call)
    words = text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    if max_tokens is not None:
        kept: list[str] = []
        for piece in pieces:
            if count_tokens("".join([*kept, piece])) > max_tokens:
                return Reply(tuple(kept), True)
            kept.append(piece)
    return Reply(tuple(pieces), False)


def _native_parts(reply: Reply, text: str) -> list[dict[str, Any]]:
    if reply.function_call is not None:
        return [{"functionCall": dict(reply.function_call)}]
    return [{"text": text}]


def native_finish(reply: Reply) -> str:
    return "MAX_TOKENS" if reply.truncated else "STOP"


def generate_response(reply: Reply, usage: Usage, model: str, response_id: str) -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": _native_parts(reply, reply.text)},
                "finishReason": native_finish(reply),
                "index": 0,
            }
        ],
        "usageMetadata": usage.metadata(),
        "modelVersion": bare_model(model),
        "responseId": response_id,
    }


def stream_chunks(reply: Reply, usage: Usage, model: str, response_id: str) -> Iterator[dict[str, Any]]:
    """streamGenerateContent chunks: every chunk carries a usage snapshot; the last one has
    the finish reason and the final candidate count."""
    pieces = list(reply.pieces) if reply.function_call is None else [""]
    if not pieces:
        pieces = [""]
    produced = ""
    for i, piece in enumerate(pieces):
        produced += piece
        last = i == len(pieces) - 1
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": _native_parts(reply, piece)}, "index": 0}
        if last:
            candidate["finishReason"] = native_finish(reply)
        so_far = Usage(usage.prompt, usage.cached, usage.candidates if last else count_tokens(produced))
        yield {
            "candidates": [candidate],
            "usageMetadata": so_far.metadata(),
            "modelVersion": bare_model(model),
            "responseId": response_id,
        }


def sse(obj: Mapping[str, Any] | str) -> bytes:
    """One SSE frame; Google separates frames with CRLF CRLF."""
    data = obj if isinstance(obj, str) else orjson.dumps(obj).decode()
    return f"data: {data}\r\n\r\n".encode()


def openai_finish(reply: Reply) -> str:
    if reply.function_call is not None:
        return "tool_calls"
    return "length" if reply.truncated else "stop"


def _openai_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    call = reply.function_call or {}
    return [
        {
            "id": "call_fake_0",
            "type": "function",
            "function": {"name": call.get("name", ""), "arguments": orjson.dumps(call.get("args", {})).decode()},
        }
    ]


def chat_completion(reply: Reply, usage: Usage, model: str, completion_id: str, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text if reply.function_call is None else None}
    if reply.function_call is not None:
        message["tool_calls"] = _openai_tool_calls(reply)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": openai_finish(reply)}],
        "usage": usage.openai(),
    }


def chat_chunks(
    reply: Reply, usage: Usage, model: str, completion_id: str, created: int, *, include_usage: bool
) -> Iterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""}, None)
    if reply.function_call is not None:
        calls = _openai_tool_calls(reply)
        calls[0]["index"] = 0
        yield chunk({"tool_calls": calls}, None)
    else:
        for piece in reply.pieces:
            yield chunk({"content": piece}, None)
    yield chunk({}, openai_finish(reply))
    if include_usage:
        yield {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage.openai(),
        }
