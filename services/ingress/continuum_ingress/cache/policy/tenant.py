"""Which tenant a request belongs to, so that tenants never share response-cache entries.

1. If `response_cache.tenant_header` is configured and the request carries it (non-empty), the
   tenant is that header's value. Only configure it behind a trusted proxy that sets the header
   itself (and strips a client-supplied one): whoever can set it can read that tenant's cache.
2. Otherwise the tenant is a digest of the caller's API key, taken from `Authorization: Bearer`,
   then `x-api-key` (Anthropic SDKs < 2), then `x-goog-api-key`. The key itself is never stored,
   logged or put in a cache key: only SHA-256 of it, truncated to 128 bits, prefixed `key:`.
3. A request without either belongs to no tenant (None): such callers share one cache space,
   as they share one anonymous identity at the router.

`headers` must answer lower-case names (Starlette's `Headers` is case-insensitive).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

_API_KEY_HEADERS = ("x-api-key", "x-goog-api-key")


def api_key_of(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.strip().partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            return token
    for name in _API_KEY_HEADERS:
        value = headers.get(name)
        if value and value.strip():
            return value.strip()
    return None


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:32]


def derive_tenant(headers: Mapping[str, str], tenant_header: str | None) -> str | None:
    if tenant_header:
        named = headers.get(tenant_header.lower())
        if named and named.strip():
            return "hdr:" + named.strip()
    api_key = api_key_of(headers)
    if api_key is not None:
        return "key:" + key_digest(api_key)
    return None
