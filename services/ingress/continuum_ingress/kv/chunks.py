"""Approximate matching keys: a request's conversation as chained hashes of fixed-size text
chunks (pure; docs/kv-scorer.md, "Approximate").

No tokenizer and no engine events are needed: the ingress renders the conversation in a
canonical form (roles and texts with separators that cannot occur in JSON strings' text), cuts
the UTF-8 bytes into `chunk_bytes` pieces and chains them,

    h_0 = 0,  h_i = BLAKE2b-64(h_{i-1} (8 bytes big-endian) ‖ chunk_i)

so two requests share the leading hashes exactly as far as their rendered conversations share a
prefix, to a chunk. Only full chunks are keyed (an engine caches full blocks only, too). The
router records the chain against the backend it routes to (kv/route_memory.py); the next turn
of that conversation, which resends everything and adds a little, matches there.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from continuum_common.hashing.request_text import content_text
from continuum_ingress.protocol.apis import Api

_U64 = struct.Struct(">Q")
# Record/unit separators: a role or text never contains them unescaped in practice, so
# `[("user", "a"), ("user", "b")]` and `[("user", "a\x1euser\x1fb")]` are the only way to collide.
_MESSAGE = "\x1e"
_FIELD = "\x1f"


def conversation_bytes(api: Api, body: Mapping[str, Any]) -> bytes:
    """The canonical rendering of what the engine will see of a request, as UTF-8 bytes."""
    if api is Api.COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt.encode("utf-8", "surrogatepass")
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return b"".join(_U64.pack(t & 0xFFFFFFFFFFFFFFFF) for t in prompt)
        return b""
    parts: list[str] = []
    tools = body.get("tools")
    if tools:
        parts.append(_FIELD + "tools" + _FIELD + orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode())
    system = body.get("system")  # Anthropic's top-level system prompt
    if system is not None:
        parts.append(_MESSAGE + "system" + _FIELD + content_text(system))
    messages = body.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        for message in messages:
            if isinstance(message, Mapping):
                role = message.get("role")
                parts.append(_MESSAGE + (role if isinstance(role, str) else "") + _FIELD)
                parts.append(content_text(message.get("content")))
    return "".join(parts).encode("utf-8", "surrogatepass")


def answered_chain(body: Mapping[str, Any], text: str, chunk_bytes: int) -> list[int]:
    """The chunk chain of a chat request's conversation followed by its answer: what its next
    turn, which resends the answer, starts with."""
    messages = body.get("messages")
    history = messages if isinstance(messages, list) else []
    extended = {**body, "messages": [*history, {"role": "assistant", "content": text}]}
    return chunk_chain(conversation_bytes(Api.CHAT, extended), chunk_bytes)


def chunk_chain(data: bytes, chunk_bytes: int) -> list[int]:
    """Chained u64 hashes of the full `chunk_bytes` chunks of `data`."""
    out: list[int] = []
    prev = b"\0" * 8
    blake = hashlib.blake2b
    for lo in range(0, len(data) - chunk_bytes + 1, chunk_bytes):
        prev = blake(prev + data[lo : lo + chunk_bytes], digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return out
