"""The normalized KV event on the bus (DESIGN.md §5): what listeners publish and the indexer
applies. Pure encode/decode, versioned, msgpack on the wire (JSON accepted on decode so a
human can publish one with the nats CLI).

    {v, backend, source_epoch, seq, ts, type, prefix_hash, token_count, tier}

`seq` is monotonic per (backend, source_epoch); a new epoch means the listener or the engine
restarted. `Nats-Msg-Id` = `<backend>:<source_epoch>:<seq>` lets JetStream drop duplicates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgpack
import orjson

from continuum_common.errors import ContinuumError

SCHEMA_VERSION = 1
STREAM_NAME = "CONTINUUM_KV"
SUBJECT_PREFIX = "continuum.kv.events."
SUBJECT_WILDCARD = "continuum.kv.events.>"
LISTENERS_BUCKET = "continuum_listeners"

_BACKEND_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


class EventType(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    EVICTED = "evicted"
    OFFLOADED = "offloaded"
    CLEARED = "cleared"


class Tier(StrEnum):
    GPU_HOT = "gpu_hot"
    STORAGE_WARM = "storage_warm"


class EventDecodeError(ContinuumError, ValueError):
    """A bus message is not a valid normalized KV event (counted and dropped by consumers)."""


@dataclass(frozen=True, slots=True)
class KvEvent:
    backend: str
    source_epoch: int
    seq: int
    ts: float
    type: EventType
    prefix_hash: str | None  # 64 lowercase hex; None only for `cleared`
    token_count: int = 0
    tier: Tier = Tier.GPU_HOT
    v: int = SCHEMA_VERSION

    @property
    def subject(self) -> str:
        return subject_for(self.backend)

    @property
    def msg_id(self) -> str:
        return f"{self.backend}:{self.source_epoch}:{self.seq}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "backend": self.backend,
            "source_epoch": self.source_epoch,
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type.value,
            "prefix_hash": self.prefix_hash,
            "token_count": self.token_count,
            "tier": self.tier.value,
        }

    def encode(self) -> bytes:
        packed: bytes = msgpack.packb(self.to_dict(), use_bin_type=True)
        return packed


def subject_for(backend: str) -> str:
    if not _BACKEND_RE.match(backend):
        raise EventDecodeError(f"invalid backend name {backend!r}")
    return SUBJECT_PREFIX + backend


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise EventDecodeError(f"field {name!r} is missing or has the wrong type")
    return value


_TYPES = {t.value: t for t in EventType}
_TIERS = {t.value: t for t in Tier}


def decode_event(payload: bytes) -> KvEvent:
    """Parse one bus message; raise EventDecodeError (never anything else) when invalid.

    This runs once per event in the indexer (tens of thousands per second), so the checks are
    inlined: `type(x) is int` is exact here because msgpack and orjson produce plain ints and
    never bools for integers."""
    try:
        data = orjson.loads(payload) if payload[:1] == b"{" else msgpack.unpackb(payload, raw=False)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise EventDecodeError(f"undecodable payload: {type(exc).__name__}") from None
    if type(data) is not dict:
        raise EventDecodeError("payload is not a map")
    get = data.get
    version = get("v")
    if type(version) is not int:
        version = _field(data, "v", int)
    if version != SCHEMA_VERSION:
        raise EventDecodeError(f"unsupported event version {version}")
    backend = get("backend")
    if type(backend) is not str:
        backend = _field(data, "backend", str)
    if not _BACKEND_RE.match(backend):
        raise EventDecodeError("invalid backend name")
    raw_type, raw_tier = get("type"), get("tier") or "gpu_hot"
    etype = _TYPES.get(raw_type) if type(raw_type) is str else None
    if etype is None:
        _field(data, "type", str)
        raise EventDecodeError("unknown event type or tier")
    tier = _TIERS.get(raw_tier) if type(raw_tier) is str else None
    if tier is None:
        raise EventDecodeError("unknown event type or tier")
    prefix_hash = get("prefix_hash")
    if etype is EventType.CLEARED:
        prefix_hash = None
    elif type(prefix_hash) is not str or not _HEX64_RE.match(prefix_hash):
        raise EventDecodeError("prefix_hash must be 64 lowercase hex characters")
    token_count = get("token_count", 0)
    if type(token_count) is not int or token_count < 0:
        raise EventDecodeError("token_count must be a non-negative integer")
    seq = get("seq")
    if type(seq) is not int:
        seq = _field(data, "seq", int)
    epoch = get("source_epoch")
    if type(epoch) is not int:
        epoch = _field(data, "source_epoch", int)
    if seq < 0 or epoch < 0:
        raise EventDecodeError("seq and source_epoch must be non-negative")
    ts = get("ts")
    if type(ts) is not float and type(ts) is not int:
        ts = _field(data, "ts", (int, float))
    return KvEvent(backend, epoch, seq, float(ts), etype, prefix_hash, token_count, tier)
