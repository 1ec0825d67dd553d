"""Which chat requests may use a Gemini context cache (pure decisions).

A cachedContents resource made by the gemini-cache service holds exactly one thing: the system
prompt (`systemInstruction`). A request can be served from it when removing its system prompt
and naming the cache gives the same request. So a request is a candidate when:

* its first message is the only `system` / `developer` message (one system prompt, in front),
  made of text only, of at least `min_prefix_bytes` UTF-8 bytes, and other messages follow;
* it has no `tools` / `functions` / `tool_choice`: Google refuses `cachedContent` together with
  tools or a tool config (they would have to live in the cache);
* the caller did not name a cache of its own (`google.cached_content`);
* the ensure message that creates the cache fits the bus's max payload;
* the backend has an API key of its own: the cache belongs to the key's Google project, and a
  caller's key (forwarded when the backend has none) may belong to another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from continuum_common.hashing.request_text import content_text
from continuum_ingress.gemini.protocol.request import SYSTEM_ROLES, google_extras

# Room for the ensure message's other fields around the system prompt (JSON escaping of the
# prompt can grow it too; the check below uses the escaped length).
ENSURE_OVERHEAD = 1024
_MAX_MODEL_LEN = 256


class Ineligible(StrEnum):
    """Why a request to a gemini backend does not use the context cache (a metric label)."""

    NO_SYSTEM = "no_system_prompt"
    SMALL = "below_min_prefix_bytes"
    SHAPE = "system_prompt_shape"
    TOOLS = "tools"
    CLIENT_CACHE = "client_cached_content"
    TOO_LARGE = "too_large_for_bus"
    NO_KEY = "backend_without_key"


@dataclass(frozen=True, slots=True)
class Candidate:
    system: str


def _text_only(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type", "text") in ("text", "input_text") for p in content
    )


def cache_candidate(body: Mapping[str, Any], min_prefix_bytes: int, max_payload: int) -> Candidate | Ineligible:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], Mapping):
        return Ineligible.NO_SYSTEM
    first = messages[0]
    if first.get("role") not in SYSTEM_ROLES:
        return Ineligible.NO_SYSTEM
    model = body.get("model")
    if (
        len(messages) < 2
        or not _text_only(first.get("content"))
        or any(isinstance(m, Mapping) and m.get("role") in SYSTEM_ROLES for m in messages[1:])
        or not isinstance(model, str)
        or not 0 < len(model) <= _MAX_MODEL_LEN
    ):
        return Ineligible.SHAPE
    system = content_text(first.get("content"))
    size = len(system.encode("utf-8"))
    if size < min_prefix_bytes:
        return Ineligible.SMALL
    if body.get("tools") or body.get("functions") or body.get("tool_choice") is not None:
        return Ineligible.TOOLS
    if google_extras(body).get("cached_content") is not None:
        return Ineligible.CLIENT_CACHE
    # JSON escaping can at most sextuple a character (\u00XX); check the cheap bound first.
    if size * 6 + ENSURE_OVERHEAD > max_payload and _escaped_size(system) + ENSURE_OVERHEAD > max_payload:
        return Ineligible.TOO_LARGE
    return Candidate(system)


def _escaped_size(text: str) -> int:
    return len(orjson.dumps(text))
