"""The Tier 1 prefix key (seed §"Prefix Key 추출"), byte-exact:

    SHA256(model ++ 0x00 ++ "S" ++ system[:max_prefix_length])      when there is a system prompt
    SHA256(model ++ 0x00 ++ "M" ++ first_msg[:max_prefix_length])   otherwise

The listener computes the same key from a recovered prompt, so this module is the single
definition both sides import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from continuum_common.hashing.request_text import first_message_text, system_text, truncate_utf8

SYSTEM_TAG = b"S"
MESSAGE_TAG = b"M"


def prefix_key_from_text(model: str, text: str, *, tag: bytes, max_prefix_length: int) -> bytes | None:
    """Digest of (model, tag, text[:max_prefix_length]); None when `text` is empty."""
    if not text:
        return None
    # The first max_prefix_length characters encode to at least as many bytes as are kept, so
    # a long system prompt is not encoded whole to keep its first KiB.
    data = truncate_utf8(text[:max_prefix_length].encode("utf-8"), max_prefix_length)
    return hashlib.sha256(model.encode("utf-8") + b"\x00" + tag + data).digest()


def request_prefix_key(body: Mapping[str, Any], *, enabled: bool, max_prefix_length: int = 1024) -> bytes | None:
    """The 32-byte prefix key of a parsed OpenAI or Anthropic request body, or None when prefix
    routing is disabled or the request carries no anchoring text."""
    if not enabled:
        return None
    model = body.get("model")
    if not isinstance(model, str):
        return None
    system = system_text(body)
    if system:
        return prefix_key_from_text(model, system, tag=SYSTEM_TAG, max_prefix_length=max_prefix_length)
    first = first_message_text(body)
    return prefix_key_from_text(model, first, tag=MESSAGE_TAG, max_prefix_length=max_prefix_length)
