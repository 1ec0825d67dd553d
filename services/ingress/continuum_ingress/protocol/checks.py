"""Small type checks that raise InvalidRequest naming the offending parameter.

JSON has no int/bool distinction problems, Python does: `True` is an `int`, so every numeric
check rejects booleans explicitly. `null` counts as "not given" for optional fields, which is
how the providers treat it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from continuum_ingress.errors import InvalidRequest


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def wrong_type(param: str, expected: str, value: object) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {type_name(value)}.",
        param=param,
        code="invalid_type",
    )


def missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def out_of_range(param: str, value: object, rule: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid value for '{param}': {value!r} {rule}.", param=param, code="invalid_value")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def require_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise missing("model")
    if not isinstance(model, str):
        raise wrong_type("model", "a string", model)
    if not model:
        raise InvalidRequest("Invalid value for 'model': must not be empty.", param="model", code="invalid_value")
    return model


def opt_bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise wrong_type(key, "a boolean", value)
    return value


def opt_str(body: Mapping[str, Any], key: str, param: str | None = None) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise wrong_type(param or key, "a string", value)
    return value


def opt_object(body: Mapping[str, Any], key: str, param: str | None = None) -> dict[str, Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise wrong_type(param or key, "an object", value)
    return value


def opt_array(body: Mapping[str, Any], key: str, param: str | None = None) -> list[Any] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise wrong_type(param or key, "an array", value)
    return value


def opt_number(
    body: Mapping[str, Any], key: str, *, low: float | None = None, high: float | None = None
) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not is_number(value):
        raise wrong_type(key, "a number", value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise out_of_range(
            key, value, f"must be between {low:g} and {high:g}" if high is not None else f"must be >= {low:g}"
        )
    return float(value)


# Sanity bounds: far above what any model accepts, low enough that no absurd value (n=1000,
# max_tokens=10**30, a negative token id) reaches a backend (docs/ingress.md).
MAX_CHOICES = 128  # OpenAI's own limit on `n`
MAX_TOKENS = 1 << 24  # max_tokens and friends: 16,777,216
MAX_TOKEN_ID = (1 << 31) - 1  # every vocabulary fits in a signed 32-bit id
MAX_TOP_LOGPROBS = 20
# JSON nesting: the parser reads 1024 levels, but re-encoding a rewritten body (orjson: 255) and
# any recursive walk over it would fail far below that; no API request needs more than a few
# dozen (deep tool schemas included).
MAX_JSON_DEPTH = 128


def nested_too_deep(raw: bytes, body: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when `body` nests arrays/objects more than `limit` levels (the body is level 1).
    The bracket count of the raw bytes rules out almost every body before any walk."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack: list[tuple[object, int]] = [(body, 1)]
    while stack:  # an explicit stack: the body may be deeper than Python's recursion limit
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def opt_int(body: Mapping[str, Any], key: str, *, low: int | None = None, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not is_int(value):
        raise wrong_type(key, "an integer", value)
    if (low is not None and value < low) or (high is not None and value > high):
        rule = f"must be >= {low}" if high is None else f"must be between {low} and {high}"
        raise out_of_range(key, value, rule)
    return int(value)


def _token_id(value: object) -> bool:
    return is_int(value) and 0 <= value <= MAX_TOKEN_ID  # type: ignore[operator]


def opt_str_or_str_array(body: Mapping[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list):
        raise wrong_type(key, "a string or an array of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise wrong_type(f"{key}[{i}]", "a string", item)


def opt_str_or_object(body: Mapping[str, Any], key: str) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, str | dict):
        raise wrong_type(key, "a string or an object", value)


def array_of_objects(value: list[Any], param: str) -> None:
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise wrong_type(f"{param}[{i}]", "an object", item)


def token_or_text_input(value: object, param: str) -> None:
    """OpenAI's `prompt` / `input`: a string, strings, token ids, or arrays of token ids."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise wrong_type(param, "a string or an array", value)
    if not value:
        raise InvalidRequest(f"Invalid value for '{param}': must not be empty.", param=param, code="invalid_value")
    first = value[0]
    if isinstance(first, str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise wrong_type(f"{param}[{i}]", "a string", item)
    elif is_int(first):
        for i, item in enumerate(value):
            if not is_int(item):
                raise wrong_type(f"{param}[{i}]", "an integer token id", item)
            if not _token_id(item):
                raise out_of_range(f"{param}[{i}]", item, f"is not a token id (0 to {MAX_TOKEN_ID})")
    elif isinstance(first, list):
        for i, item in enumerate(value):
            if not isinstance(item, list) or not item or not all(is_int(t) for t in item):
                raise wrong_type(f"{param}[{i}]", "a non-empty array of integer token ids", item)
            bad = next((j for j, t in enumerate(item) if not _token_id(t)), None)
            if bad is not None:
                raise out_of_range(f"{param}[{i}][{bad}]", item[bad], f"is not a token id (0 to {MAX_TOKEN_ID})")
    else:
        raise wrong_type(f"{param}[0]", "a string, an integer or an array of integers", first)
