"""Block mode's fast path: a vLLM map-encoded batch (vLLM ≥ 2026-06, kv-events-spec §1.3)
decoded by msgspec straight into block events.

The generic decoder (protocol.engine) reads every era and checks each field in Python, and
materializes every token id; a blocks-only source needs neither. Here the map-era schema is
declared as msgspec structs (validated in C; token ids stay undecoded bytes, only their count is
read from the array header) and mapped with BlockMapper's rules. A batch is accepted only when
every event in it is well-formed and every field known: anything else — the array eras, SGLang,
a map-shaped batch, a malformed or unknown event, an unknown field — returns None before anything
was applied, and the caller uses the generic decoder, which counts problems per event. Both
paths give the same block events and the same counters (the tests compare them on every fixture
and on random batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Final

import msgspec

from continuum_listener.protocol.blocks import BlockMapper, EventBuilder, medium_tier
from continuum_listener.protocol.engine import DEFAULT_LIMITS, MAIN_ATTENTION_KINDS

_U64: Final = 1 << 64
_Hash = int | Annotated[bytes, msgspec.Meta(min_length=1, max_length=64)]
_Hashes = Annotated[list[_Hash], msgspec.Meta(min_length=1, max_length=DEFAULT_LIMITS.max_hashes)]
_Medium = Annotated[str, msgspec.Meta(max_length=64)] | None
_ANY = msgspec.Raw(b"\xc0")  # an absent field that may hold anything


class _Stored(msgspec.Struct, tag="BlockStored", tag_field="type", forbid_unknown_fields=True):
    block_hashes: _Hashes
    parent_block_hash: _Hash | None
    token_ids: msgspec.Raw
    block_size: Annotated[int, msgspec.Meta(ge=0)]
    lora_id: msgspec.Raw = _ANY
    medium: _Medium = None
    lora_name: str | None = None
    extra_keys: msgspec.Raw = _ANY
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: msgspec.Raw = _ANY
    locality: msgspec.Raw = _ANY


class _Removed(msgspec.Struct, tag="BlockRemoved", tag_field="type", forbid_unknown_fields=True):
    block_hashes: _Hashes
    medium: _Medium = None
    group_idx: int | None = None
    locality: msgspec.Raw = _ANY


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", forbid_unknown_fields=True):
    pass


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: Annotated[list[_Stored | _Removed | _Cleared], msgspec.Meta(max_length=DEFAULT_LIMITS.max_array)]
    rank: int | None = None


_decoder = msgspec.msgpack.Decoder(_Batch)


@dataclass(slots=True)
class FastBatch:
    """What a batch held, for the source's counters (its block events are in the builder)."""

    stored: int = 0
    removed: int = 0
    cleared: int = 0
    mismatches: int = 0  # stores whose token count does not match block_size × hashes

    @property
    def events(self) -> int:
        return self.stored + self.removed + self.cleared


def _array_length(raw: msgspec.Raw) -> int | None:
    """Elements of a msgpack array, read from its header; None when `raw` is not an array."""
    data = memoryview(raw)
    if not data:
        return None
    head = data[0]
    if 0x90 <= head <= 0x9F:
        return head - 0x90
    if head == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big")
    if head == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big")
    return None


def _norm(value: int | bytes) -> int:
    if isinstance(value, bytes):
        return int.from_bytes(value[-8:], "big")
    return value if value >= 0 else value + _U64


def _main(kind: str | None, group: int | None) -> bool:
    return kind in MAIN_ATTENTION_KINDS if kind is not None else not group


def decode_into(payload: bytes, mapper: BlockMapper, out: EventBuilder, skipped: dict[str, int]) -> FastBatch | None:
    """Map one payload into `out`; None (nothing applied) when the generic decoder must read it."""
    if len(payload) > DEFAULT_LIMITS.max_bytes:
        return None
    try:
        batch = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        # RecursionError: msgspec skips a nested value (an unused field) by recursing; the
        # generic decoder refuses such a payload with a counted drop.
        return None
    tokens: list[int] = []
    for event in batch.events:
        if type(event) is _Stored:
            n = _array_length(event.token_ids)
            if n is None or n > DEFAULT_LIMITS.max_array:
                return None
            tokens.append(n)
    result, stores = FastBatch(), iter(tokens)
    for event in batch.events:
        if isinstance(event, _Removed):
            if not _main(None, event.group_idx):
                skipped["attention_group"] = skipped.get("attention_group", 0) + 1
                continue
            result.removed += 1
            out.removed([_norm(h) for h in event.block_hashes], medium_tier(event.medium))
        elif isinstance(event, _Stored):
            token_count = next(stores)
            if not _main(event.kv_cache_spec_kind, event.group_idx):
                skipped["attention_group"] = skipped.get("attention_group", 0) + 1
                continue
            result.stored += 1
            result.mismatches += _stored(event, token_count, mapper, out, skipped)
        else:
            result.cleared += 1
            out.cleared()
    return result


def _stored(event: _Stored, token_count: int, mapper: BlockMapper, out: EventBuilder, skipped: dict[str, int]) -> bool:
    """BlockMapper's rules for one store; True when its token count does not match its size."""
    hashes = [_norm(h) for h in event.block_hashes]
    parent = None if event.parent_block_hash is None else _norm(event.parent_block_hash)
    size, tier = event.block_size, medium_tier(event.medium)
    if token_count == 0 and size == 0:  # offload placeholder
        out.stored(hashes, parent, 0, tier)
        return False
    n = len(hashes)
    configured = mapper.configured
    ok = token_count > 0 and size > 0 and token_count == size * n
    if ok and configured is not None:
        ok = size == configured or (n == 1 and size < configured)
    if size < mapper.full_size(size):
        skipped["partial_block"] = skipped.get("partial_block", 0) + n
    else:
        out.stored(hashes, parent, size, tier)
    return token_count > 0 and not ok
