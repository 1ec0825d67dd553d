"""Hashing primitives shared by ingress, listener and gemini-cache (docs/hashing.md)."""

from continuum_common.hashing.cache_key import (
    DOCUMENTED_OUTPUT_FIELDS,
    NON_OUTPUT_FIELDS,
    CacheKeyError,
    response_cache_key,
)
from continuum_common.hashing.gemini import gemini_digest, gemini_digest_from_text
from continuum_common.hashing.prefix_key import (
    MESSAGE_TAG,
    SYSTEM_TAG,
    prefix_key_from_text,
    request_prefix_key,
)
from continuum_common.hashing.request_text import (
    content_text,
    first_message_text,
    system_text,
    truncate_utf8,
)

__all__ = [
    "DOCUMENTED_OUTPUT_FIELDS",
    "MESSAGE_TAG",
    "NON_OUTPUT_FIELDS",
    "SYSTEM_TAG",
    "CacheKeyError",
    "content_text",
    "first_message_text",
    "gemini_digest",
    "gemini_digest_from_text",
    "prefix_key_from_text",
    "request_prefix_key",
    "response_cache_key",
    "system_text",
    "truncate_utf8",
]
