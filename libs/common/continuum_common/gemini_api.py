"""Google Generative Language API wire details shared by the gemini-cache service, the ingress
and the fake Gemini server (provider-apis.md §1). Pure functions, no I/O.

* `Duration` strings (`"300s"`, `"3.5s"`) and RFC 3339 timestamps with up to 9 fractional digits;
* `models/{id}` and `cachedContents/{id}` resource names;
* the `CachedContent` fields the router needs;
* `google.rpc.Status` error bodies, including the `min_total_token_count` of the 400 that Google
  sends when a cache is below the model's minimum size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from continuum_common.errors import ContinuumError

API_VERSION = "v1beta"
CACHED_CONTENTS = "cachedContents"
MODEL_PREFIX = "models/"
CACHE_PREFIX = "cachedContents/"

_TIMESTAMP_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})$"
)
_DURATION_RE = re.compile(r"^(\d+)(?:\.(\d{1,9}))?s$")
_MIN_TOKENS_RE = re.compile(r"min_total_token_count=(\d+)")
_TOTAL_TOKENS_RE = re.compile(r"(?<!min_)total_token_count=(\d+)")


class GeminiFormatError(ContinuumError, ValueError):
    """A value does not follow the Generative Language API's wire format."""


def api_root(url: str) -> str:
    """The API root of a `type: gemini` backend URL: the configured URL may name the root
    (`https://generativelanguage.googleapis.com`), a version (`…/v1beta`) or the
    OpenAI-compatible base (`…/v1beta/openai`); native calls go to `<root>/v1beta/…`."""
    root = url.rstrip("/")
    if root.endswith("/openai"):
        root = root[: -len("/openai")]
    for version in ("/v1beta", "/v1alpha", "/v1"):
        if root.endswith(version):
            return root[: -len(version)]
    return root


def model_resource(model: str) -> str:
    """`gemini-2.5-flash` → `models/gemini-2.5-flash` (the SDK's `t_model`); already-prefixed
    names are kept."""
    model = model.strip()
    if not model:
        raise GeminiFormatError("model name is empty")
    return model if model.startswith(MODEL_PREFIX) else MODEL_PREFIX + model


def bare_model(model: str) -> str:
    """`models/gemini-2.5-flash` → `gemini-2.5-flash`."""
    return model[len(MODEL_PREFIX) :] if model.startswith(MODEL_PREFIX) else model


def cache_resource(name: str) -> str:
    """Normalise a bare cache id into `cachedContents/{id}` (the SDK's `t_cached_content_name`)."""
    return name if name.startswith(CACHE_PREFIX) else CACHE_PREFIX + name


def format_ttl(seconds: float) -> str:
    """Seconds → protobuf Duration JSON: `600` → `"600s"`, `3.5` → `"3.5s"`."""
    if seconds < 0:
        raise GeminiFormatError("ttl must not be negative")
    nanos = round(seconds * 1_000_000_000)
    whole, frac = divmod(nanos, 1_000_000_000)
    if frac == 0:
        return f"{whole}s"
    return f"{whole}.{frac:09d}".rstrip("0") + "s"


def parse_ttl(value: str) -> float:
    """`"300s"` / `"3.5s"` → seconds."""
    match = _DURATION_RE.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise GeminiFormatError(f"invalid duration {value!r}: expected '<seconds>[.fraction]s'")
    frac = match[2] or ""
    return int(match[1]) + (int(frac.ljust(9, "0")) / 1_000_000_000 if frac else 0.0)


def format_timestamp(ts: float) -> str:
    """Unix seconds → RFC 3339 UTC with microseconds, as Google writes `createTime`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(value: str) -> float:
    """RFC 3339 (up to 9 fractional digits, `Z` or an offset) → Unix seconds."""
    match = _TIMESTAMP_RE.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise GeminiFormatError(f"invalid timestamp {value!r}: expected RFC 3339")
    year, month, day, hour, minute, second = (int(match[i]) for i in range(1, 7))
    frac = match[7] or ""
    zone = match[8]
    try:
        base = datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()
    except ValueError as exc:
        raise GeminiFormatError(f"invalid timestamp {value!r}: {exc}") from None
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        base -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return base + (int(frac.ljust(9, "0")) / 1_000_000_000 if frac else 0.0)


@dataclass(frozen=True, slots=True)
class CachedContentInfo:
    """What the router keeps from a `CachedContent` response."""

    name: str
    model: str
    expire_at: float
    total_token_count: int | None


def parse_cached_content(body: Any) -> CachedContentInfo:
    """Read `name`, `model`, `expireTime` and `usageMetadata.totalTokenCount` from a create,
    get or patch response; raise GeminiFormatError when a required field is missing."""
    if not isinstance(body, Mapping):
        raise GeminiFormatError("CachedContent body is not a JSON object")
    name = body.get("name")
    if not isinstance(name, str) or not name.startswith(CACHE_PREFIX) or len(name) == len(CACHE_PREFIX):
        raise GeminiFormatError("CachedContent has no cachedContents/{id} name")
    expire = body.get("expireTime")
    if not isinstance(expire, str):
        raise GeminiFormatError("CachedContent has no expireTime")
    usage = body.get("usageMetadata")
    tokens = usage.get("totalTokenCount") if isinstance(usage, Mapping) else None
    model = body.get("model")
    return CachedContentInfo(
        name=name,
        model=model if isinstance(model, str) else "",
        expire_at=parse_timestamp(expire),
        total_token_count=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
    )


@dataclass(frozen=True, slots=True)
class GoogleError:
    """A non-200 answer, reduced to what the router decides on. `message` may quote the
    request (Google echoes some values), so callers log `status`/`reason`, not `message`."""

    http_status: int
    status: str  # google.rpc code name, e.g. INVALID_ARGUMENT; "" when absent
    message: str
    reason: str  # ErrorInfo.reason, e.g. API_KEY_INVALID; "" when absent
    min_total_token_count: int | None
    total_token_count: int | None

    @property
    def too_small(self) -> bool:
        return self.min_total_token_count is not None

    @property
    def api_key_invalid(self) -> bool:
        return self.reason == "API_KEY_INVALID"


def parse_error(http_status: int, body: Any) -> GoogleError:
    """Parse `{"error": {"code", "message", "status", "details"}}`; any other body (HTML from a
    proxy, empty) still yields a GoogleError with the HTTP status."""
    err = body.get("error", body) if isinstance(body, Mapping) else {}
    if not isinstance(err, Mapping):
        err = {}
    message = err.get("message")
    message = message if isinstance(message, str) else ""
    status = err.get("status")
    reason = ""
    details = err.get("details")
    if isinstance(details, list):
        for detail in details:
            if isinstance(detail, Mapping) and isinstance(detail.get("reason"), str):
                reason = detail["reason"]
                break
    min_tokens = _MIN_TOKENS_RE.search(message)
    total = _TOTAL_TOKENS_RE.search(message)
    return GoogleError(
        http_status=http_status,
        status=status if isinstance(status, str) else "",
        message=message,
        reason=reason,
        min_total_token_count=int(min_tokens[1]) if min_tokens else None,
        total_token_count=int(total[1]) if total else None,
    )


def is_stale_cache_reference(http_status: int, body: Any) -> bool:
    """True when a generateContent / compat call failed because its `cachedContent` reference
    is gone (expired or deleted): Google answers 403 PERMISSION_DENIED ("CachedContent not found
    (or permission denied)"), some proxies 404, and a malformed or foreign reference is a 400
    that names CachedContent. The caller retries once without the reference."""
    if http_status not in (400, 403, 404):
        return False
    err = parse_error(http_status, body)
    text = err.message.lower()
    if http_status in (403, 404):
        return "cachedcontent" in text or "cached content" in text or not text
    # 400: only the messages about the reference itself, not "cannot be combined with
    # system_instruction" (a request bug that a retry without the reference would hide).
    return ("cachedcontent" in text or "cached content" in text) and "can not be used with" not in text
