"""Routing decisions shared between ingress replicas (core NATS, subject
`continuum.kv.decisions.<replica>`; every replica subscribes to `continuum.kv.decisions.*` and
skips its own subject without decoding it).

Each replica publishes, for every request it routes with the KV scorer, the chain of keys it
sent and where; every other replica records it as if it had routed the request itself
(approximate records, precise-mode speculative entries), so N replicas keep conversations
together as one router would. Fire and forget: a lost message costs at most one less sticky
decision. msgpack via msgspec, a tagged array:

    [replica, group, backend, kind, ts, keys, new_tokens]

`kind` 0 = speculative block entry (precise mode), 1 = approximate chunk record. `new_tokens` is
the uncached prompt the backend was given (the replicas' shared view of recent demand).
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec

from continuum_common.errors import ContinuumError
from continuum_common.wire.codec import StructCodec

SUBJECT_PREFIX: Final = "continuum.kv.decisions."
SUBJECT_WILDCARD: Final = "continuum.kv.decisions.*"
KIND_SPECULATIVE: Final = 0
KIND_APPROXIMATE: Final = 1
MAX_KEYS: Final = 1 << 17

_U64 = Annotated[int, msgspec.Meta(ge=0)]


_REPLICA_RE = re.compile(r"[^A-Za-z0-9_-]")


def replica_id(host: str, pid: int, nonce: str) -> str:
    """A replica's id: safe as a NATS subject token."""
    return _REPLICA_RE.sub("_", f"{host}-{pid}-{nonce}")[:120]


def subject_for(replica: str) -> str:
    return SUBJECT_PREFIX + replica


class DecisionDecodeError(ContinuumError, ValueError):
    """A decision message that cannot be used (counted and dropped)."""


class Decision(msgspec.Struct, array_like=True, frozen=True):
    replica: str
    group: str
    backend: str
    kind: Annotated[int, msgspec.Meta(ge=0, le=1)]
    ts: float
    keys: Annotated[list[_U64], msgspec.Meta(max_length=MAX_KEYS)]
    new_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0


_codec = StructCodec(Decision, DecisionDecodeError, "decision")
encode_decision = _codec.encode
decode_decision = _codec.decode
