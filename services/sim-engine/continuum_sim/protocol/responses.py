"""Response bodies in the shapes vLLM's OpenAI server and Anthropic's Messages API return
(provider-apis.md §2-3; kv-events-spec.md §1.9 for the error object)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from continuum_sim.errors import RequestError


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def openai_error(exc: RequestError) -> dict[str, Any]:
    """vLLM's error object since #22099: `{"error": {message, type, param, code}}`."""
    code = exc.status if exc.error_code is None else exc.error_code
    return {"error": {"message": exc.message, "type": exc.error_type, "param": exc.param, "code": code}}


def anthropic_error(exc: RequestError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": exc.anthropic_type, "message": exc.message}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def chat_completion(
    rid: str,
    model: str,
    text: str,
    finish_reason: str,
    usage_body: dict[str, Any],
    *,
    ids: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    """`ids` (prompt, output): vLLM's `return_token_ids` fields, the prompt's at the top level
    and the output's in the choice."""
    out: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ],
        "usage": usage_body,
        "system_fingerprint": None,
    }
    if ids is not None:
        out["choices"][0]["token_ids"] = ids[1]
        out["prompt_token_ids"] = ids[0]
    return out


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish_reason: str | None,
    *,
    include_usage: bool,
    token_ids: list[int] | None = None,
    prompt_token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """`token_ids` / `prompt_token_ids`: vLLM's `return_token_ids` fields (the output ids of a
    content chunk in its choice; the prompt's at the top level of the first chunk)."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if include_usage:
        chunk["usage"] = None
    if prompt_token_ids is not None:
        chunk["prompt_token_ids"] = prompt_token_ids
    return chunk


def usage_chunk(rid: str, model: str, created: int, obj: str, usage_body: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage_body}


def _completion_choice(
    text: str, finish_reason: str | None, ids: tuple[list[int] | None, list[int]] | None
) -> dict[str, Any]:
    """One completion choice; `ids` (prompt or None, output): vLLM's `return_token_ids` fields."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    if ids is not None:
        choice["prompt_token_ids"] = ids[0]
        choice["token_ids"] = ids[1]
    return choice


def completion(
    rid: str,
    model: str,
    text: str,
    finish_reason: str,
    usage_body: dict[str, Any],
    *,
    ids: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    """`ids` (prompt, output): vLLM's `return_token_ids` fields, both in the choice."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": now(),
        "model": model,
        "choices": [_completion_choice(text, finish_reason, ids)],
        "usage": usage_body,
        "system_fingerprint": None,
    }


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    *,
    include_usage: bool,
    ids: tuple[list[int] | None, list[int]] | None = None,
) -> dict[str, Any]:
    """`ids` (prompt or None, output): vLLM's `return_token_ids` fields in the choice, the
    prompt's on the first chunk only (null after it)."""
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [_completion_choice(text, finish_reason, ids)],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def anthropic_usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Anthropic semantics: `input_tokens` excludes the tokens read from the cache."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def anthropic_stop_reason(finish_reason: str) -> str:
    return "max_tokens" if finish_reason == "length" else "end_turn"


def anthropic_message(
    rid: str, model: str, text: str, finish_reason: str, usage_body: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": anthropic_stop_reason(finish_reason),
        "stop_sequence": None,
        "usage": usage_body,
    }


def sse_data(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def sse_event(name: str, obj: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def models_list(models: list[str], max_model_len: int, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": m,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": m,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [],
            }
            for m in models
        ],
    }
