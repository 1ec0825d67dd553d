"""Gemini cachedContents digest: the prefix-key structure over the *whole* system prompt.

SHA256(model ++ 0x00 ++ "S" ++ system)        (no truncation)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from continuum_common.hashing.prefix_key import SYSTEM_TAG
from continuum_common.hashing.request_text import system_text


def gemini_digest_from_text(model: str, system: str) -> bytes:
    return hashlib.sha256(model.encode("utf-8") + b"\x00" + SYSTEM_TAG + system.encode("utf-8")).digest()


def gemini_digest(body: Mapping[str, Any]) -> bytes | None:
    """Digest of a request's model and whole system prompt; None without either."""
    model = body.get("model")
    system = system_text(body)
    if not isinstance(model, str) or not system:
        return None
    return gemini_digest_from_text(model, system)
