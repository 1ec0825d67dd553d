"""The OpenAI-shaped side of Gemini context caching (pure).

* `with_cached_content`: the request with its (leading, only) system message removed and the
  cache named in `extra_body.google.cached_content`, the documented wire placement on Google's
  OpenAI-compatible endpoint (provider-apis.md §1.7). The native conversion maps the same field
  to the top-level `cachedContent`, so this one body shape serves both APIs.
* Usage accounting on answers of the compat endpoint: read
  `usage.prompt_tokens_details.cached_tokens`; when a request that used the cache comes back
  without it (Google's compat usage is not documented to carry it for explicit caches), fill in
  the cache's token count, so clients always see what was served from the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from continuum_common.sse import SseEvent, SseLimitError, SseSplitter
from continuum_ingress.gemini.protocol.sse import MAX_EVENT_BYTES


def with_cached_content(body: Mapping[str, Any], cached_content: str) -> dict[str, Any]:
    """A new body (the input is not mutated) using `cached_content` instead of messages[0]."""
    extra = body.get("extra_body")
    extra = dict(extra) if isinstance(extra, Mapping) else {}
    google = extra.get("google")
    google = dict(google) if isinstance(google, Mapping) else {}
    google["cached_content"] = cached_content
    extra["google"] = google
    return {**body, "messages": list(body["messages"][1:]), "extra_body": extra}


def usage_cached_tokens(usage: Any) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, None when the answer does not say."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _fill(usage: dict[str, Any], cached: int) -> None:
    details = usage.get("prompt_tokens_details")
    details = dict(details) if isinstance(details, Mapping) else {}
    details["cached_tokens"] = cached
    usage["prompt_tokens_details"] = details


def observe_body(data: bytes, fill: int | None) -> tuple[bytes, int | None]:
    """(the body to send, the cached tokens it reports). The bytes are unchanged unless a
    cached-token count must be filled in (`fill`: the cache's token count on a cache hit)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data, None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return data, None
    cached = usage_cached_tokens(usage)
    if cached is not None or fill is None:
        return data, cached
    _fill(usage, fill)
    return orjson.dumps(obj), fill


class CompatStreamTap:
    """Passes an OpenAI SSE stream through event by event (a partial event waits for its end),
    noting the usage chunk's cached tokens and filling them in when missing on a cache hit.
    Events it does not rewrite pass byte for byte."""

    def __init__(self, fill: int | None) -> None:
        self.fill = fill
        self.cached: int | None = None
        self.saw_usage = False
        self._splitter: SseSplitter | None = SseSplitter(MAX_EVENT_BYTES)

    def feed(self, data: bytes) -> bytes:
        if self._splitter is None:
            return data
        try:
            events = self._splitter.feed(data)
        except SseLimitError:
            self._splitter = None  # not SSE we understand: pass the rest through untouched
            return data
        return b"".join(self._event(e) for e in events)

    def finish(self) -> bytes:
        if self._splitter is None:
            return b""
        rest = self._splitter.close()
        if rest is None or not rest.raw.strip():
            return b""
        out = self._event(rest)
        return out.rstrip(b"\r\n") + b"\n\n"  # the blank line the stream did not send

    def _event(self, event: SseEvent) -> bytes:
        data = event.data
        if data is None or '"usage"' not in data or "prompt_tokens" not in data:
            return event.raw
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event.raw
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if not isinstance(usage, dict):
            return event.raw
        self.saw_usage = True
        self.cached = usage_cached_tokens(usage)
        if self.cached is not None or self.fill is None:
            return event.raw
        _fill(usage, self.fill)
        self.cached = self.fill
        return b"data: " + orjson.dumps(obj) + b"\n\n"
