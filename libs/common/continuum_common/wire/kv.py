"""KV events on the bus, version 2: one message per engine batch, carrying the engine's own
block hashes (docs/kv-index.md, "Block events").

    KvBatch {v: 2, backend, source_epoch, seq, ts, events: [BlocksStored | BlocksRemoved | AllCleared]}

msgpack via msgspec. The batch is a map (named fields); events are tagged arrays, the tag first:

    [1, hashes, parent, block_tokens, tier]      BlocksStored
    [2, hashes, tier]                            BlocksRemoved
    [3]                                          AllCleared

* `hashes` are unsigned 64-bit integers, in chain order for a store. They are the values the
  ingress recomputes from a request's token ids (continuum_common.hashing.blocks): vLLM's last
  8 digest bytes, SGLang's first 8 (its signed int64 read as unsigned), and for engines whose
  hashes cannot be recomputed (TensorRT-LLM) the listener's content hash of the block's tokens.
* `parent` is the hash of the block before `hashes[0]` (None at the root of a chain).
* `block_tokens` is the number of tokens in each block of the event (the engine's block size).
* `tier` is 0 for GPU memory (`gpu_hot`), 1 for any storage tier (`storage_warm`).

Ordering: `seq` counts batches from 1 within `(backend, source_epoch)`; a new epoch starts with
a batch whose first event is AllCleared. An empty `events` list is a keepalive: it says the
backend's event stream is alive (consumers refresh the backend's TTL) and changes nothing else.
`Nats-Msg-Id` = `<backend>:<source_epoch>:b<seq>` (the `b` keeps it apart from version-1 ids,
which a listener may still publish for the prefix-key index in the same epoch).

Version 1 (continuum_common.events.KvEvent: one prefix-key event per message) is still accepted:
`decode_bus_payload` returns either a KvBatch or a KvEvent, so consumers handle both during an
upgrade.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec

from continuum_common.errors import ContinuumError
from continuum_common.events import SCHEMA_VERSION as V1
from continuum_common.events import EventDecodeError, KvEvent, decode_event

WIRE_VERSION: Final = 2
TIER_GPU: Final = 0
TIER_STORAGE: Final = 1
U64_MAX: Final = (1 << 64) - 1
# Bounds a decoder enforces (a batch over them is dropped and counted as too_large).
MAX_EVENTS_PER_BATCH: Final = 65_535
MAX_HASHES_PER_BATCH: Final = 1 << 20

_BACKEND_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Range checks run inside msgspec's decoder (C), not in a Python loop over every hash; msgpack
# cannot carry an integer above 2**64 - 1, so `ge=0` is the whole unsigned 64-bit check.
U64 = Annotated[int, msgspec.Meta(ge=0)]
TierCode = Annotated[int, msgspec.Meta(ge=0, le=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class BatchDecodeError(ContinuumError, ValueError):
    """A bus payload is not a valid KV batch (counted and dropped by consumers)."""


class BlocksStored(msgspec.Struct, tag=1, array_like=True, frozen=True):
    hashes: list[U64]
    parent: U64 | None = None
    block_tokens: Count = 0
    tier: TierCode = TIER_GPU


class BlocksRemoved(msgspec.Struct, tag=2, array_like=True, frozen=True):
    hashes: list[U64]
    tier: TierCode = TIER_GPU


class AllCleared(msgspec.Struct, tag=3, array_like=True, frozen=True):
    pass


BlockEvent = BlocksStored | BlocksRemoved | AllCleared


class KvBatch(msgspec.Struct, frozen=True):
    backend: str
    source_epoch: Count
    seq: Count
    ts: float
    events: list[BlockEvent]
    v: int = WIRE_VERSION

    @property
    def msg_id(self) -> str:
        return f"{self.backend}:{self.source_epoch}:b{self.seq}"

    @property
    def block_count(self) -> int:
        """Block events in this batch (a store or removal of n hashes counts n)."""
        return sum(len(e.hashes) for e in self.events if not isinstance(e, AllCleared))


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KvBatch)


def encode_batch(batch: KvBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KvBatch:
    """Parse and validate a version-2 payload; BatchDecodeError (never anything else) when bad."""
    try:
        batch = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BatchDecodeError(f"undecodable batch: {exc}") from None
    except RecursionError:  # msgspec skips an unknown field's value by recursing into it
        raise BatchDecodeError("undecodable batch: nested too deeply") from None
    _validate(batch)
    return batch


def _validate(batch: KvBatch) -> None:
    if batch.v != WIRE_VERSION:
        raise BatchDecodeError(f"unsupported batch version {batch.v}")
    if not _BACKEND_RE.match(batch.backend):
        raise BatchDecodeError("invalid backend name")
    if len(batch.events) > MAX_EVENTS_PER_BATCH:
        raise BatchDecodeError("too many events in one batch")
    total = 0
    for event in batch.events:
        if not isinstance(event, AllCleared):
            total += len(event.hashes)
    if total > MAX_HASHES_PER_BATCH:
        raise BatchDecodeError("too many block hashes in one batch")


def decode_bus_payload(payload: bytes) -> KvBatch | KvEvent:
    """A version-2 batch or a version-1 event; BatchDecodeError for anything else (a v1 payload
    that fails v1 validation raises BatchDecodeError too, with the v1 reason)."""
    version = _peek_version(payload)
    if version == V1:
        try:
            return decode_event(payload)
        except EventDecodeError as exc:
            raise BatchDecodeError(str(exc)) from None
    return decode_batch(payload)


class _Versioned(msgspec.Struct):
    v: int = 0


_peek = msgspec.msgpack.Decoder(_Versioned)
_peek_json = msgspec.json.Decoder(_Versioned)


def _peek_version(payload: bytes) -> int:
    try:
        if payload[:1] == b"{":
            return _peek_json.decode(payload).v
        return _peek.decode(payload).v
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise BatchDecodeError("undecodable payload") from None
