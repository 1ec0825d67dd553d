"""Token ids from a backend's own `/tokenize` (vLLM, SGLang and the simulator serve it): precise
mode without a local tokenizer.

Chat requests use vLLM's chat form (`messages`, `add_generation_prompt: true`, the tools), so
the engine applies its own chat template; completions use the prompt form. The call goes over
the backend's upstream transport (the interface of transport.py, like forwarding), bounded by
the group's `tokenize_timeout_ms`; any failure raises TokenizeFailed and the scorer falls back
to approximate keys for the request.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Mapping
from typing import Any

import orjson

from continuum_ingress.kv.groups import chat_messages
from continuum_ingress.protocol.apis import Api
from continuum_ingress.transport import Upstream, UpstreamError

MAX_TOKENS = 4_000_000  # an answer with more ids than this is refused (bounded memory)
assert array("I").itemsize == 4  # token ids are checked as unsigned 32-bit ints
_HEADERS = [("content-type", "application/json"), ("accept", "application/json")]


class TokenizeFailed(Exception):
    """The backend's /tokenize did not give usable token ids."""


def tokenize_body(
    api: Api,
    body: Mapping[str, Any],
    model: str,
    *,
    messages: list[dict[str, Any]] | None = None,
    generation: bool = True,
) -> dict[str, Any]:
    """The /tokenize request for `body`; `messages` (already in chat_messages' form) replaces
    the request's own, for the leading messages of a conversation (then usually without the
    generation prompt)."""
    if api is Api.COMPLETIONS:
        return {"model": model, "prompt": body.get("prompt", ""), "add_special_tokens": True}
    chat = chat_messages(api, body) if messages is None else messages
    out: dict[str, Any] = {"model": model, "messages": chat, "add_generation_prompt": generation}
    if body.get("tools"):
        out["tools"] = body["tools"]
    if isinstance(body.get("chat_template_kwargs"), Mapping):
        out["chat_template_kwargs"] = body["chat_template_kwargs"]
    return out


def token_ids(value: object, raw: bytes | None = None) -> bool:
    """Whether `value` (parsed JSON; `raw`, its JSON text when at hand) is a list of token ids:
    ints in [0, 2**32), at most MAX_TOKENS. Checked in C, not id by id in Python (~8× faster
    for a 12k-token prompt): an unsigned 32-bit array takes exactly such ints and refuses
    floats, strings and nulls, and booleans, which it would take as 0 and 1, are the only
    letters the list's JSON could hold."""
    if not isinstance(value, list) or len(value) > MAX_TOKENS:
        return False
    try:
        array("I", value)
    except (TypeError, OverflowError):
        return False
    data = orjson.dumps(value) if raw is None else raw
    return b"t" not in data and b"f" not in data


def parse_tokens(data: bytes) -> list[int]:
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise TokenizeFailed("the /tokenize answer is not JSON") from None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or len(tokens) > MAX_TOKENS:
        raise TokenizeFailed("the /tokenize answer has no usable token list")
    if not token_ids(tokens):
        raise TokenizeFailed("the /tokenize answer has token ids out of range")
    return tokens


async def remote_tokens(
    client: Upstream,
    path: str,
    *,
    api: Api,
    body: Mapping[str, Any],
    model: str,
    timeout_s: float,
    messages: list[dict[str, Any]] | None = None,
    generation: bool = True,
) -> list[int]:
    content = orjson.dumps(tokenize_body(api, body, model, messages=messages, generation=generation))
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.transport.request("POST", path, _HEADERS, content, read_timeout=timeout_s)
            try:
                data = await response.read()
            finally:
                await response.aclose()
    except TimeoutError:
        raise TokenizeFailed("/tokenize timed out") from None
    except UpstreamError as exc:
        raise TokenizeFailed(f"/tokenize failed: {type(exc).__name__}") from None
    if response.status != 200:
        raise TokenizeFailed(f"/tokenize answered HTTP {response.status}")
    return parse_tokens(data)
