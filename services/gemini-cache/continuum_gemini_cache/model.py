"""The records the service keeps per (backend, digest), and their JSON form in the state store."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from continuum_gemini_cache.errors import StateError


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
        obj = _load(data)
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
            raise StateError(f"corrupt cache entry record: {exc!r}") from None


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
        obj = _load(data)
        try:
            return cls(
                backend=str(obj["backend"]),
                digest=str(obj["digest"]),
                model=str(obj["model"]),
                until=float(obj["until"]),
                created_at=float(obj["created_at"]),
                min_total_token_count=_opt_int(obj.get("min_total_token_count")),
                total_token_count=_opt_int(obj.get("total_token_count")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"corrupt negative entry record: {exc!r}") from None


def _opt_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def _load(data: bytes | str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise StateError("corrupt state record (not JSON)") from None
    if not isinstance(obj, dict):
        raise StateError("corrupt state record (not an object)")
    return obj


class Found(StrEnum):
    HIT = "hit"
    MISS = "miss"
    NEGATIVE = "negative"


@dataclass(frozen=True, slots=True)
class LookupState:
    found: Found
    entry: Entry | None = None
    negative: NegativeEntry | None = None
    in_flight: bool = False  # a create lock is held for this id (any replica)
    expired: Entry | None = None  # an entry that this read found expired and removed


class Removal(StrEnum):
    EVICTED = "evicted"  # LRU, over max_entries: DELETE it at Google
    EXPIRED = "expired"  # past its expiry: Google already dropped it
    REPLACED = "replaced"  # the same id got a new resource: DELETE the old one


@dataclass(frozen=True, slots=True)
class Removed:
    reason: Removal
    entry: Entry | None = None
    negative: NegativeEntry | None = None

    @property
    def backend(self) -> str:
        record = self.entry or self.negative
        return record.backend if record is not None else ""


@dataclass(frozen=True, slots=True)
class Counts:
    entries: int
    negative_entries: int
    in_flight: int
    per_backend: dict[str, tuple[int, int]]  # backend -> (entries, negative entries)
