"""Error bodies in the shapes the official SDKs parse (reference/provider-apis.md §2.5, §3.3).

OpenAI:    {"error": {"message", "type", "param", "code"}}
Anthropic: {"type": "error", "error": {"type", "message"}, "request_id"}
"""

from __future__ import annotations

from enum import StrEnum

import orjson

from continuum_ingress.errors import RequestError


class ErrorStyle(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


# kind -> OpenAI `type`
_OPENAI_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "invalid_request_error",
    "too_large": "invalid_request_error",
    "auth": "authentication_error",
    "method": "invalid_request_error",
    "bad_gateway": "api_error",
    "unavailable": "api_error",
    "timeout": "api_error",
    "internal": "api_error",
}
# status -> Anthropic `error.type` (docs.claude.com/en/api/errors)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


def openai_error_body(error: RequestError) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": error.message,
                "type": _OPENAI_TYPES.get(error.kind, "api_error"),
                "param": error.param,
                "code": error.code,
            }
        }
    )


def anthropic_error_body(error: RequestError, request_id: str) -> bytes:
    # Anthropic bodies have no `param`; its own messages lead with the field path, so do we.
    message = f"{error.param}: {error.message}" if error.param else error.message
    return orjson.dumps(
        {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(error.status, "api_error"), "message": message},
            "request_id": request_id,
        }
    )


def error_body(style: ErrorStyle, error: RequestError, request_id: str) -> bytes:
    if style is ErrorStyle.ANTHROPIC:
        return anthropic_error_body(error, request_id)
    return openai_error_body(error)


def stream_error_event(style: ErrorStyle, message: str) -> bytes:
    """An in-band SSE error for a stream that broke after it began (status already sent).

    The OpenAI SDK raises APIError on a `data:` object with a top-level `error`; the Anthropic
    SDK raises on `event: error` (provider-apis.md §3.2, §2.4)."""
    if style is ErrorStyle.ANTHROPIC:
        payload = orjson.dumps({"type": "error", "error": {"type": "api_error", "message": message}})
        return b"event: error\ndata: " + payload + b"\n\n"
    payload = orjson.dumps({"error": {"message": message, "type": "api_error", "param": None, "code": None}})
    return b"data: " + payload + b"\n\n"
