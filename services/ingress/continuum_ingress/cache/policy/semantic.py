"""Semantic-cache decisions (seed "시맨틱 캐시"): which requests take the path, what text is
embedded, and the partition digest that bounds every similarity comparison.

Eligible: a non-stream chat request (OpenAI chat or Anthropic messages) with temperature 0 or
omitted whose last message is a `user` turn made only of text, at most `max_input_bytes` of
UTF-8. The text embedded is that turn's text (parts joined by a newline).

Two requests can answer each other only when their partition digests are equal. The digest
covers the caller's identity (tenant), the route, the model, the embedding model, every
request field that can shape the output (all fields but the conversation, `stream` and the
key's NON_OUTPUT_FIELDS: tools, response_format, sampling parameters, seed, system, ...),
the whole conversation before the last user turn (system prompt included), and the last
turn's own fields other than its content (e.g. `name`). So a different API key, system
prompt, tool list or earlier turn never shares an entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import orjson

from continuum_common.hashing import NON_OUTPUT_FIELDS
from continuum_ingress.cache.policy.eligibility import Route, is_stream, is_zero_temperature

SEMANTIC_ROUTES: Final = frozenset({Route.CHAT, Route.ANTHROPIC})
PARTITION_VERSION: Final = 1
_OUTSIDE_PARTITION: Final = NON_OUTPUT_FIELDS | {"messages", "stream"}


def last_user_text(body: Mapping[str, Any]) -> str | None:
    """The last message's text if it is a user turn made only of text, else None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            return None  # images, audio, tool results: not a plain text turn
        texts.append(part["text"])
    return "\n".join(texts)


def semantic_text(
    body: object, *, route: str, max_input_bytes: int, omitted_temperature_is_zero: bool = False
) -> str | None:
    """The text to embed, or None when the request does not take the semantic path."""
    if route not in SEMANTIC_ROUTES or not isinstance(body, Mapping):
        return None
    if is_stream(body) or not is_zero_temperature(body, omitted_is_zero=omitted_temperature_is_zero):
        return None
    text = last_user_text(body)
    if text is None or not text.strip() or len(text.encode("utf-8")) > max_input_bytes:
        return None
    return text


def partition_digest(body: Mapping[str, Any], *, tenant_id: str | None, route: str, embedding_model: str) -> str:
    """Hex SHA-256 of everything that must match for two requests to share an answer.
    Call only for bodies `semantic_text` accepted (canonical JSON of parsed JSON cannot fail)."""
    messages = body["messages"]
    last = {k: v for k, v in messages[-1].items() if k != "content"}
    material = {
        "v": PARTITION_VERSION,
        "tenant": tenant_id,
        "route": str(route),
        "model": body.get("model"),
        "embedding_model": embedding_model,
        "fields": {k: v for k, v in body.items() if k not in _OUTSIDE_PARTITION},
        "history": messages[:-1],
        "last": last,
    }
    return hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()


def semantic_entry_id(partition: str, text: str) -> str:
    """Store id of a semantic body (`sem:<id>`): the same question in the same partition maps
    to the same id, so repeats overwrite instead of piling up."""
    return hashlib.sha256(partition.encode("ascii") + b"\x00" + text.encode("utf-8")).hexdigest()
