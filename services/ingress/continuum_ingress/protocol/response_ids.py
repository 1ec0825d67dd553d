"""Response ids of the OpenAI Responses API, as the router reads them off the wire (pure).

A Responses request that continues a stored response names it in `previous_response_id`. The
backend that stored it is found by the id of each answer: the top-level `id` of a whole
response object, or the `response.id` of a stream's first event (`response.created`, which
engines send before the first token). A backend that does not hold the stored response answers
404 with the id in its error message (vLLM: "Response with id '…' not found.", OpenAI:
"Previous response with id '…' not found.").
"""

from __future__ import annotations

from typing import Any

import orjson

from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.requests import ParsedRequest

# How much of a 404 body is read to find the id in it (error bodies are small).
NOT_FOUND_BODY_LIMIT = 8192
MAX_ID_LENGTH = 256  # longer values are not ids an engine made; they are not remembered


def previous_response_id(request: ParsedRequest) -> str | None:
    """The stored response a Responses request continues, or None."""
    if request.api is not Api.RESPONSES:
        return None
    value = request.body.get("previous_response_id")
    return value if isinstance(value, str) and value else None


def _valid(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH else None


def id_in_body(data: bytes) -> str | None:
    """The `id` of a whole response object; None when the body is not one."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return _valid(obj.get("id")) if isinstance(obj, dict) else None


def id_in_stream_head(chunk: bytes) -> str | None:
    """The response id in the first complete `data:` line of a stream's first chunk (the
    `response.created` event carries the response object); None when that line has none."""
    for raw in chunk.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line.startswith(b"data:"):
            continue
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return None  # cut in the middle of the line, or not JSON: not learnt
        response = event.get("response") if isinstance(event, dict) else None
        return _valid(response.get("id")) if isinstance(response, dict) else None
    return None


def not_found_here(status: int, body: bytes, response_id: str) -> bool:
    """True when a backend's answer says it does not hold `response_id`: a 404 that names it."""
    return status == 404 and response_id.encode() in body[:NOT_FOUND_BODY_LIMIT]
