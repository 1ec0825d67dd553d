"""Gemini `generateContent` response -> OpenAI chat completion; usage, finish reasons and error
bodies (provider-apis.md §1.4, §1.6, §3.1, §3.3).

Usage: `promptTokenCount` already includes the cached tokens, so `prompt_tokens` stays the full
prompt and `cachedContentTokenCount` (explicit and implicit caching alike) becomes
`prompt_tokens_details.cached_tokens`, a subset of it. Thinking tokens count as completion
tokens (`completion_tokens_details.reasoning_tokens`), as OpenAI counts reasoning tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

# Gemini FinishReason -> OpenAI finish_reason.
FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "LANGUAGE": "stop",
    "OTHER": "stop",
    "MALFORMED_FUNCTION_CALL": "stop",
    "FINISH_REASON_UNSPECIFIED": "stop",
}
# google.rpc HTTP status -> OpenAI error type.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def _int(meta: Mapping[str, Any], key: str) -> int:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cached_tokens(meta: Any) -> int:
    """`usageMetadata.cachedContentTokenCount`, 0 when absent."""
    return _int(meta, "cachedContentTokenCount") if isinstance(meta, dict) else 0


def openai_usage(meta: Mapping[str, Any]) -> dict[str, Any]:
    """`usageMetadata` -> the chat completion `usage` object."""
    prompt = _int(meta, "promptTokenCount") + _int(meta, "toolUsePromptTokenCount")
    thoughts = _int(meta, "thoughtsTokenCount")
    completion = _int(meta, "candidatesTokenCount") + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": _int(meta, "totalTokenCount") or prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached_tokens(meta)},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


def responses_usage(meta: Mapping[str, Any]) -> dict[str, Any]:
    """`usageMetadata` -> the Responses API `usage` object (`input_tokens_details.cached_tokens`)."""
    chat = openai_usage(meta)
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": chat["completion_tokens_details"]["reasoning_tokens"]},
        "total_tokens": chat["total_tokens"],
    }


def finish_reason(reason: Any, has_tool_calls: bool) -> str:
    mapped = FINISH_REASONS.get(reason, "stop") if isinstance(reason, str) else "stop"
    return "tool_calls" if has_tool_calls and mapped == "stop" else mapped


def split_parts(parts: Any) -> tuple[str, list[Mapping[str, Any]]]:
    """(answer text, function-call parts) of a candidate's parts; thought summaries are left
    out of the answer."""
    texts: list[str] = []
    calls: list[Mapping[str, Any]] = []
    if isinstance(parts, list):
        for part in parts:
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("functionCall"), dict):
                calls.append(part)
            elif isinstance(part.get("text"), str) and part.get("thought") is not True:
                texts.append(part["text"])
    return "".join(texts), calls


def tool_call(part: Mapping[str, Any], call_id: str) -> dict[str, Any]:
    """An OpenAI tool call for a `functionCall` part (the Gemini 3 thought signature rides in
    `extra_content.google.thought_signature`, as on Google's compat endpoint)."""
    fn = part["functionCall"]
    args = fn.get("args")
    out: dict[str, Any] = {
        "id": fn["id"] if isinstance(fn.get("id"), str) and fn["id"] else call_id,
        "type": "function",
        "function": {"name": str(fn.get("name", "")), "arguments": orjson.dumps(args or {}).decode()},
    }
    if isinstance(part.get("thoughtSignature"), str):
        out["extra_content"] = {"google": {"thought_signature": part["thoughtSignature"]}}
    return out


def _logprobs(result: Any) -> dict[str, Any] | None:
    if not isinstance(result, dict):
        return None
    chosen = result.get("chosenCandidates") or []
    tops = result.get("topCandidates") or []
    content = []
    for i, item in enumerate(chosen):
        token = str(item.get("token", ""))
        entry: dict[str, Any] = {
            "token": token,
            "logprob": float(item.get("logProbability", 0.0)),
            "bytes": list(token.encode()),
            "top_logprobs": [],
        }
        if i < len(tops) and isinstance(tops[i], dict):
            for top in tops[i].get("candidates") or []:
                text = str(top.get("token", ""))
                entry["top_logprobs"].append(
                    {"token": text, "logprob": float(top.get("logProbability", 0.0)), "bytes": list(text.encode())}
                )
        content.append(entry)
    return {"content": content, "refusal": None}


def _choice(candidate: Mapping[str, Any], index: int, id_prefix: str) -> dict[str, Any]:
    content = candidate.get("content")
    text, calls = split_parts(content.get("parts") if isinstance(content, dict) else None)
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = [tool_call(p, f"call_{id_prefix}_{index}_{n}") for n, p in enumerate(calls)]
    return {
        "index": candidate.get("index", index) if isinstance(candidate.get("index"), int) else index,
        "message": message,
        "logprobs": _logprobs(candidate.get("logprobsResult")),
        "finish_reason": finish_reason(candidate.get("finishReason"), bool(calls)),
    }


def to_chat_completion(response: Mapping[str, Any], *, model: str, created: int, fallback_id: str) -> dict[str, Any]:
    """A chat completion for a generateContent response. A prompt blocked by safety filters
    (no candidates, `promptFeedback.blockReason`) is an empty answer with `content_filter`."""
    response_id = response.get("responseId")
    suffix = response_id if isinstance(response_id, str) and response_id else fallback_id
    candidates = response.get("candidates")
    choices = [_choice(c, i, suffix) for i, c in enumerate(candidates if isinstance(candidates, list) else []) if c]
    if not choices:
        choices = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": "content_filter",
            }
        ]
    meta = response.get("usageMetadata")
    return {
        "id": f"chatcmpl-{suffix}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": openai_usage(meta if isinstance(meta, dict) else {}),
    }


def google_error_fields(body: Any) -> tuple[int | None, str, str]:
    """(code, status, message) of a google.rpc.Status body (`{"error": {...}}`, possibly inside
    a one-element list, as some Google front ends send it)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return None, "", ""
    code = err.get("code")
    status = err.get("status")
    message = err.get("message")
    return (
        code if isinstance(code, int) else None,
        status if isinstance(status, str) else "",
        message if isinstance(message, str) else "",
    )


def openai_error(code: int | None, status: str, message: str) -> dict[str, Any]:
    """An OpenAI error body for a Google error (the openai SDK reads `error.message`/`type`/`code`)."""
    return {
        "error": {
            "message": message or f"The Gemini API answered {status or code}.",
            "type": _ERROR_TYPES.get(code or 0, "api_error"),
            "param": None,
            "code": status.lower() if status else None,
        }
    }
