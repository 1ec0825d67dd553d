"""The gemini-cache bus protocol (DESIGN.md §5): subjects, message types and their JSON
encoding, and the records the service keeps in its state store. Pure; the ingress and the gemini-cache service both import it.

| subject                         | kind                          | request → reply                        |
|---------------------------------|-------------------------------|----------------------------------------|
| `continuum.gemini.lookup`       | request/reply (queue group)   | LookupRequest → LookupReply            |
| `continuum.gemini.ensure`       | publish; reply optional       | EnsureRequest → EnsureReply            |
| `continuum.gemini.drop`         | publish; reply optional       | DropRequest → DropReply                |
| `continuum.gemini.usage`        | request/reply (acknowledged)  | UsageReport → {} (ingress counters)    |
| `continuum.gemini.admin.stats`  | request/reply                 | {} → stats JSON (the seed's shape)     |
| `continuum.gemini.admin.clear`  | request/reply                 | {} → {"success": true, "cleared_entries": N} |

Every message is a JSON object with `"v": 1`. Decoders accept unknown fields (newer senders)
and raise GeminiProtocolError (never anything else) on malformed input, so a receiver can count
and drop it. `digest` is the 64-hex SHA-256 of `continuum_common.hashing.gemini`.
Ensure payloads carry the system prompt: never log them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from continuum_common.errors import ContinuumError
from continuum_common.hashing.gemini import gemini_digest_from_text

PROTOCOL_VERSION = 1

SUBJECT_LOOKUP = "continuum.gemini.lookup"
SUBJECT_ENSURE = "continuum.gemini.ensure"
SUBJECT_DROP = "continuum.gemini.drop"
SUBJECT_USAGE = "continuum.gemini.usage"
SUBJECT_ADMIN_STATS = "continuum.gemini.admin.stats"
SUBJECT_ADMIN_CLEAR = "continuum.gemini.admin.clear"
# Lookups, ensures, drops and usage reports are spread over the replicas of the service;
# admin requests are too (every replica answers from the shared state).
QUEUE_GROUP = "continuum-gemini-cache"

# Request timeouts for callers. The lookup timeout comes from the config
# (`gemini_context_cache.lookup_timeout_ms`, default 50 ms; a timeout counts as a miss).
ADMIN_TIMEOUT_S = 5.0
DROP_TIMEOUT_S = 1.0
# An ensure sent with a reply subject answers once the create finished or failed; wait
# create_timeout_ms plus this margin.
ENSURE_REPLY_MARGIN_S = 2.0

NOT_ENABLED_ERROR = "Gemini context cache is not enabled"

_BACKEND_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_MAX_MODEL_LEN = 256
MIN_TTL_SECONDS = 60.0
MAX_TTL_SECONDS = 365 * 86400.0


class GeminiProtocolError(ContinuumError, ValueError):
    """A gemini-cache bus message is malformed (receivers count it and drop it)."""


# --------------------------------------------------------------------------- field checks


def _obj(data: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise GeminiProtocolError(f"not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise GeminiProtocolError("message is not a JSON object")
    version = value.get("v", PROTOCOL_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise GeminiProtocolError("v must be a positive integer")
    return value


def _backend(obj: Mapping[str, Any]) -> str:
    value = obj.get("backend")
    if not isinstance(value, str) or not _BACKEND_RE.match(value):
        raise GeminiProtocolError("backend must match [A-Za-z0-9_-]{1,64}")
    return value


def _model(obj: Mapping[str, Any]) -> str:
    value = obj.get("model")
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_MODEL_LEN:
        raise GeminiProtocolError(f"model must be a non-empty string of at most {_MAX_MODEL_LEN} characters")
    return value


def _digest(obj: Mapping[str, Any]) -> str:
    value = obj.get("digest")
    if not isinstance(value, str) or not _HEX64_RE.match(value):
        raise GeminiProtocolError("digest must be 64 lowercase hex characters")
    return value


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise GeminiProtocolError(f"{key} must be a string")
    return value


def _opt_num(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GeminiProtocolError(f"{key} must be a number")
    return float(value)


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GeminiProtocolError(f"{key} must be a non-negative integer")
    return value


def _dump(obj: Mapping[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in obj.items() if v is not None})


def entry_id(backend: str, digest: str) -> str:
    """The state key of one cache entry: a digest is cached once per backend (each backend
    has its own API key, so its own Google project and its own cachedContents)."""
    return f"{backend}:{digest}"


def digest_hex(model: str, system_instruction: str) -> str:
    return gemini_digest_from_text(model, system_instruction).hex()


# --------------------------------------------------------------------------- lookup


@dataclass(frozen=True, slots=True)
class LookupRequest:
    backend: str
    model: str
    digest: str

    def to_bytes(self) -> bytes:
        return _dump({"v": PROTOCOL_VERSION, "backend": self.backend, "model": self.model, "digest": self.digest})

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> LookupRequest:
        obj = _obj(data)
        return cls(backend=_backend(obj), model=_model(obj), digest=_digest(obj))


class LookupResult(StrEnum):
    HIT = "hit"
    MISS = "miss"
    NEGATIVE = "negative"


@dataclass(frozen=True, slots=True)
class LookupReply:
    """`hit`: inject `cached_content` until `expire_at` (Unix seconds). `miss`: forward
    uncached and publish an ensure unless `in_flight` says a create is already running.
    `negative`: Google refused this prefix; forward uncached, do not ensure before
    `negative_until`."""

    result: LookupResult
    cached_content: str | None = None
    expire_at: float | None = None
    token_count: int | None = None
    in_flight: bool = False
    negative_until: float | None = None
    min_total_token_count: int | None = None

    @property
    def hit(self) -> bool:
        return self.result is LookupResult.HIT

    def to_bytes(self) -> bytes:
        return _dump(
            {
                "v": PROTOCOL_VERSION,
                "result": self.result.value,
                "cached_content": self.cached_content,
                "expire_at": self.expire_at,
                "token_count": self.token_count,
                "in_flight": self.in_flight or None,
                "negative_until": self.negative_until,
                "min_total_token_count": self.min_total_token_count,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> LookupReply:
        obj = _obj(data)
        try:
            result = LookupResult(str(obj.get("result")))
        except ValueError:
            raise GeminiProtocolError("result must be hit, miss or negative") from None
        reply = cls(
            result=result,
            cached_content=_opt_str(obj, "cached_content"),
            expire_at=_opt_num(obj, "expire_at"),
            token_count=_opt_int(obj, "token_count"),
            in_flight=obj.get("in_flight") is True,
            negative_until=_opt_num(obj, "negative_until"),
            min_total_token_count=_opt_int(obj, "min_total_token_count"),
        )
        if result is LookupResult.HIT and (reply.cached_content is None or reply.expire_at is None):
            raise GeminiProtocolError("a hit needs cached_content and expire_at")
        return reply


# --------------------------------------------------------------------------- ensure


@dataclass(frozen=True, slots=True)
class EnsureRequest:
    """Everything the service needs to create the cache: `POST /v1beta/cachedContents` with
    `model`, `systemInstruction` (this text, one part) and `ttl` (`ttl_seconds`, or the
    configured `gemini_context_cache.ttl` when None)."""

    backend: str
    model: str
    digest: str
    system_instruction: str
    ttl_seconds: float | None = None

    @classmethod
    def build(
        cls, backend: str, model: str, system_instruction: str, ttl_seconds: float | None = None
    ) -> EnsureRequest:
        """Build a request with its digest computed from `model` and `system_instruction`."""
        return cls(backend, model, digest_hex(model, system_instruction), system_instruction, ttl_seconds)

    def digest_matches(self) -> bool:
        return digest_hex(self.model, self.system_instruction) == self.digest

    def to_bytes(self) -> bytes:
        return _dump(
            {
                "v": PROTOCOL_VERSION,
                "backend": self.backend,
                "model": self.model,
                "digest": self.digest,
                "system_instruction": self.system_instruction,
                "ttl_seconds": self.ttl_seconds,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> EnsureRequest:
        obj = _obj(data)
        text = obj.get("system_instruction")
        if not isinstance(text, str) or not text:
            raise GeminiProtocolError("system_instruction must be a non-empty string")
        ttl = _opt_num(obj, "ttl_seconds")
        if ttl is not None and not MIN_TTL_SECONDS <= ttl <= MAX_TTL_SECONDS:
            raise GeminiProtocolError(f"ttl_seconds must be between {MIN_TTL_SECONDS:g} and {MAX_TTL_SECONDS:g}")
        return cls(_backend(obj), _model(obj), _digest(obj), text, ttl)


class EnsureOutcome(StrEnum):
    CREATED = "created"  # this ensure created the cache
    EXISTS = "exists"  # a live entry was already there
    IN_FLIGHT = "in_flight"  # another ensure (here or on another replica) is creating it
    NEGATIVE = "negative"  # refused earlier; negative entry still live
    REJECTED = "rejected"  # Google refused it now (400): a negative entry was recorded
    FAILED = "failed"  # transient failure (timeout, 5xx, 429...): nothing recorded, retried later
    INELIGIBLE = "ineligible"  # unknown / non-gemini backend, prompt below min_prefix_bytes, digest mismatch
    OVERLOADED = "overloaded"  # the service's bounded create queue was full (counted drop)


@dataclass(frozen=True, slots=True)
class EnsureReply:
    outcome: EnsureOutcome
    cached_content: str | None = None
    expire_at: float | None = None
    min_total_token_count: int | None = None
    error: str | None = None

    def to_bytes(self) -> bytes:
        return _dump(
            {
                "v": PROTOCOL_VERSION,
                "outcome": self.outcome.value,
                "cached_content": self.cached_content,
                "expire_at": self.expire_at,
                "min_total_token_count": self.min_total_token_count,
                "error": self.error,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> EnsureReply:
        obj = _obj(data)
        try:
            outcome = EnsureOutcome(str(obj.get("outcome")))
        except ValueError:
            raise GeminiProtocolError("unknown ensure outcome") from None
        return cls(
            outcome=outcome,
            cached_content=_opt_str(obj, "cached_content"),
            expire_at=_opt_num(obj, "expire_at"),
            min_total_token_count=_opt_int(obj, "min_total_token_count"),
            error=_opt_str(obj, "error"),
        )


# --------------------------------------------------------------------------- drop


@dataclass(frozen=True, slots=True)
class DropRequest:
    """Google rejected `cached_content` (expired or deleted): forget the entry, but only while
    it still names that resource, so a fresh replacement is never dropped by a late report."""

    backend: str
    digest: str
    cached_content: str

    def to_bytes(self) -> bytes:
        return _dump(
            {
                "v": PROTOCOL_VERSION,
                "backend": self.backend,
                "digest": self.digest,
                "cached_content": self.cached_content,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> DropRequest:
        obj = _obj(data)
        name = obj.get("cached_content")
        if not isinstance(name, str) or not name.startswith("cachedContents/"):
            raise GeminiProtocolError("cached_content must be a cachedContents/{id} name")
        return cls(_backend(obj), _digest(obj), name)


@dataclass(frozen=True, slots=True)
class DropReply:
    dropped: bool

    def to_bytes(self) -> bytes:
        return _dump({"v": PROTOCOL_VERSION, "dropped": self.dropped})

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> DropReply:
        return cls(dropped=_obj(data).get("dropped") is True)


# --------------------------------------------------------------------------- usage


class RequestOutcome(StrEnum):
    """What happened to one eligible-or-not chat request at the ingress."""

    HIT = "hit"
    MISS = "miss"
    NEGATIVE = "negative"
    INELIGIBLE = "ineligible"


USAGE_FIELDS: tuple[str, ...] = (*(o.value for o in RequestOutcome), "cached_tokens")


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Request-level counters since the previous report, per backend:
    `{backend: {"hit", "miss", "negative", "ineligible", "cached_tokens"}}`. `cached_tokens` sums
    `usageMetadata.cachedContentTokenCount` (explicit and implicit caching alike)."""

    backends: dict[str, dict[str, int]]

    def to_bytes(self) -> bytes:
        return _dump({"v": PROTOCOL_VERSION, "backends": self.backends})

    def requests(self) -> int:
        """How many requests' outcomes the report carries."""
        return sum(counters.get(o.value, 0) for counters in self.backends.values() for o in RequestOutcome)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> UsageReport:
        raw = _obj(data).get("backends")
        if not isinstance(raw, dict):
            raise GeminiProtocolError("backends must be an object")
        out: dict[str, dict[str, int]] = {}
        for backend, counters in raw.items():
            if not isinstance(backend, str) or not _BACKEND_RE.match(backend) or not isinstance(counters, dict):
                raise GeminiProtocolError("backends must map backend names to counter objects")
            out[backend] = {name: _opt_int(counters, name) or 0 for name in USAGE_FIELDS}
        return cls(out)


@dataclass(slots=True)
class UsageAccumulator:
    """Ingress side: count outcomes locally (no I/O per request) and send `drain()` on
    SUBJECT_USAGE every second or so, as a request the service acknowledges (an empty JSON
    object), so a report nobody received is known and counted. Bounded by the number of
    configured backends."""

    _counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def record(self, backend: str, outcome: RequestOutcome, cached_tokens: int = 0) -> None:
        counters = self._counts.setdefault(backend, dict.fromkeys(USAGE_FIELDS, 0))
        counters[outcome.value] += 1
        if cached_tokens > 0:
            counters["cached_tokens"] += cached_tokens

    def add_cached_tokens(self, backend: str, cached_tokens: int) -> None:
        """For cached tokens known only after the response (streams), and implicit-cache hits."""
        if cached_tokens > 0:
            counters = self._counts.setdefault(backend, dict.fromkeys(USAGE_FIELDS, 0))
            counters["cached_tokens"] += cached_tokens

    def drain(self) -> UsageReport | None:
        if not self._counts:
            return None
        report, self._counts = UsageReport(self._counts), {}
        return report


# --------------------------------------------------------------------------- admin


@dataclass(frozen=True, slots=True)
class ClearReply:
    success: bool
    cleared_entries: int = 0
    cleared_negative_entries: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        if not self.success:
            return {"success": False, "error": self.error or "clear failed"}
        return {
            "success": True,
            "cleared_entries": self.cleared_entries,
            "cleared_negative_entries": self.cleared_negative_entries,
        }

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_json())

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | str) -> ClearReply:
        obj = _obj(data)
        if obj.get("success") is not True:
            return cls(success=False, error=_opt_str(obj, "error") or "clear failed")
        return cls(
            success=True,
            cleared_entries=_opt_int(obj, "cleared_entries") or 0,
            cleared_negative_entries=_opt_int(obj, "cleared_negative_entries") or 0,
        )


def not_enabled_reply() -> dict[str, Any]:
    """The seed's answer of both admin endpoints when the feature is off."""
    return {"success": False, "error": NOT_ENABLED_ERROR}


def decode_stats(data: bytes | bytearray | memoryview | str) -> dict[str, Any]:
    """The stats reply is the seed's JSON object, passed through to the HTTP admin endpoint
    as is; this only checks it is one."""
    return _obj(data)


# --------------------------------------------------------------------------- stored records
# The gemini-cache's records in its state store (Redis `cr:gem:*`): compact JSON objects with
# the keys below in this order, absent optionals as null.


class GeminiRecordError(GeminiProtocolError):
    """A stored record this version cannot read."""


@dataclass(frozen=True, slots=True)
class Entry:
    """A live cachedContents resource owned by the service."""

    backend: str
    digest: str
    model: str
    name: str  # cachedContents/{id}
    expire_at: float  # Unix seconds, from Google's expireTime
    ttl_seconds: float  # the TTL it was created (or last extended) with
    created_at: float
    token_count: int | None = None
    last_use: float = 0.0  # filled from the LRU order when read

    @property
    def id(self) -> str:
        return f"{self.backend}:{self.digest}"

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "backend": self.backend,
                "digest": self.digest,
                "model": self.model,
                "name": self.name,
                "expire_at": self.expire_at,
                "ttl_seconds": self.ttl_seconds,
                "created_at": self.created_at,
                "token_count": self.token_count,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str, last_use: float = 0.0) -> Entry:
        obj = _record_obj(data)
        try:
            return cls(
                backend=str(obj["backend"]),
                digest=str(obj["digest"]),
                model=str(obj["model"]),
                name=str(obj["name"]),
                expire_at=float(obj["expire_at"]),
                ttl_seconds=float(obj["ttl_seconds"]),
                created_at=float(obj["created_at"]),
                token_count=int(obj["token_count"]) if obj.get("token_count") is not None else None,
                last_use=last_use,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GeminiRecordError(f"corrupt cache entry record: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class NegativeEntry:
    """Google refused to cache this prefix; no create attempts until `until`."""

    backend: str
    digest: str
    model: str
    until: float
    created_at: float
    min_total_token_count: int | None = None
    total_token_count: int | None = None

    @property
    def id(self) -> str:
        return f"{self.backend}:{self.digest}"

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "backend": self.backend,
                "digest": self.digest,
                "model": self.model,
                "until": self.until,
                "created_at": self.created_at,
                "min_total_token_count": self.min_total_token_count,
                "total_token_count": self.total_token_count,
            }
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> NegativeEntry:
        obj = _record_obj(data)
        try:
            return cls(
                backend=str(obj["backend"]),
                digest=str(obj["digest"]),
                model=str(obj["model"]),
                until=float(obj["until"]),
                created_at=float(obj["created_at"]),
                min_total_token_count=_int_or_none(obj.get("min_total_token_count")),
                total_token_count=_int_or_none(obj.get("total_token_count")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GeminiRecordError(f"corrupt negative entry record: {exc!r}") from None


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


def _record_obj(data: bytes | str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise GeminiRecordError("corrupt state record (not JSON)") from None
    if not isinstance(obj, dict):
        raise GeminiRecordError("corrupt state record (not an object)")
    return obj
