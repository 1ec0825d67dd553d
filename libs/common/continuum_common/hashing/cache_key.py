"""The response-cache key: the seed's formula, extended with every other output-shaping field.

Seed part (seed §"Cache Key 계산"), byte for byte:

    SHA256( model ++ 0x00 ++ SHA256(messages) ++ 0x00 ++ temperature
            ++ 0x00 ++ opt(max_tokens) ++ 0x00 ++ opt(top_p) ++ 0x00 ++ opt(tenant_id)
            ++ 0x00 ++ extension )

* `messages` is hashed as canonical JSON (keys sorted, no whitespace, UTF-8); completions
  bodies hash their `prompt` in that slot.
* temperature: IEEE-754 float64 little-endian (an omitted temperature is 0.0 here and is told
  apart from an explicit 0 by the extension).
* opt(x): 0x00 for None; 0x01 followed by the value: max_tokens as uint64 little-endian, top_p
  as float64 little-endian, tenant_id as UTF-8.
* extension (appended as is; it is the last element, so no length prefix is needed): canonical
  JSON of `{"fields": {...}, "route": ..., "stream": bool,
  "temperature_set": bool}` where `fields` holds **every other field of the body** except the
  few that cannot change the output (`NON_OUTPUT_FIELDS`) and `route` names the API (chat,
  completions, anthropic, …). A deny-list, not an allow-list: a
  field this code has never heard of still separates keys, which is the safe failure.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from typing import Any

import orjson

# Fields that identify or bill the caller but never change the generated output.
NON_OUTPUT_FIELDS = frozenset(
    {
        "user",
        "metadata",
        "store",
        "safety_identifier",
        "prompt_cache_key",
        "request_id",
        "priority",
        "cache_salt",
    }
)
# Fields that already have a slot of their own in the seed's formula.
_SLOT_FIELDS = frozenset({"model", "messages", "prompt", "temperature", "max_tokens", "top_p", "stream"})
_NOT_IN_EXTENSION = _SLOT_FIELDS | NON_OUTPUT_FIELDS

# Output-shaping fields the extension is known to cover; tests prove each one changes the key.
DOCUMENTED_OUTPUT_FIELDS = (
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "stop",
    "stop_sequences",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
    "reasoning",
    "thinking",
    "max_completion_tokens",
    "parallel_tool_calls",
    "stream_options",
    "top_k",
    "min_p",
    "system",
    "modalities",
    "audio",
    "prediction",
    "verbosity",
    "chat_template_kwargs",
    "guided_json",
    "structured_outputs",
    "echo",
    "suffix",
    "best_of",
)

_NONE = b"\x00"
_F64 = struct.Struct("<d")
_sha256 = hashlib.sha256
_dumps = orjson.dumps
_SORT_KEYS = orjson.OPT_SORT_KEYS
_SOME = b"\x01"


class CacheKeyError(ValueError):
    """The body cannot be keyed (missing model, non-JSON values)."""


def _canonical(value: Any) -> bytes:
    try:
        return _dumps(value, option=_SORT_KEYS)
    except TypeError as exc:
        raise CacheKeyError(f"request body is not canonical JSON: {exc}") from None


def _number(value: Any, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise CacheKeyError(f"{name} must be a finite number")
    return float(value)


def _opt_u64(value: Any, name: str) -> bytes:
    if value is None:
        return _NONE
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise CacheKeyError(f"{name} must be a non-negative integer")
    return _SOME + value.to_bytes(8, "little")


def _opt_f64(value: Any, name: str) -> bytes:
    if value is None:
        return _NONE
    return _SOME + _F64.pack(_number(value, name))


def response_cache_key(
    body: Mapping[str, Any], *, tenant_id: str | None, route: str = "chat", stream: bool | None = None
) -> str:
    """Hex SHA-256 key of a parsed request body. `stream` defaults to the body's own flag."""
    model = body.get("model")
    if not isinstance(model, str):
        raise CacheKeyError("model must be a string")
    conversation = body["messages"] if "messages" in body else body.get("prompt")
    temperature = body.get("temperature")
    is_stream = bool(body.get("stream")) if stream is None else stream
    extension = {
        "fields": {k: v for k, v in body.items() if k not in _NOT_IN_EXTENSION},
        "route": route,
        "stream": is_stream,
        "temperature_set": temperature is not None,
    }
    temp = 0.0 if temperature is None else _number(temperature, "temperature")
    max_tokens = body.get("max_tokens")
    top_p = body.get("top_p")
    # One join and one digest: per-field hasher.update() calls cost more than the hashing here.
    material = b"\x00".join(
        (
            model.encode("utf-8"),
            _sha256(_canonical(conversation)).digest(),
            _F64.pack(temp),
            _NONE if max_tokens is None else _opt_u64(max_tokens, "max_tokens"),
            _NONE if top_p is None else _opt_f64(top_p, "top_p"),
            _NONE if tenant_id is None else _SOME + tenant_id.encode("utf-8"),
            _canonical(extension),
        )
    )
    return _sha256(material).hexdigest()
