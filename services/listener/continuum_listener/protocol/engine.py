"""vLLM and SGLang KV-event payloads (msgpack) → `Batch` (kv-events-spec §1.3-§1.6, §2.2).

Every era is accepted by one decoder:

* batch: array `[ts, events]` / `[ts, events, rank]`, or a map `{ts, events, data_parallel_rank}`
  (the unmerged 0181ea31 revision; `attn_dp_rank` is SGLang's name for the same slot);
* events: tagged arrays (vLLM ≤ 2026-05 and SGLang; fields only ever appended, so read
  positionally and tolerate both shorter and longer arrays) or tagged maps (vLLM ≥ 2026-06,
  absent key = default);
* hashes: uint64, negative int64 or raw digest bytes (normalized in `model.norm_hash`).

One bad event never spoils the batch: it is skipped and counted by reason. A payload that is not
a batch at all raises DecodeError.
"""

from __future__ import annotations

from typing import Any

import msgpack

from continuum_listener.errors import DecodeError
from continuum_listener.protocol.model import (
    GPU,
    Batch,
    Cleared,
    Removed,
    Stored,
    norm_hash,
)
from continuum_listener.protocol.salt_scan import salt_candidate

# Array positions after the tag (kv-events-spec §1.4; SGLang's first six match vLLM's).
STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_STORED_KEYS = frozenset({"type", "locality", *STORED_FIELDS})
_REMOVED_KEYS = frozenset({"type", "locality", *REMOVED_FIELDS})
MAIN_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


class Limits:
    """Bounds on what one payload may contain (protects memory before anything is tracked)."""

    __slots__ = ("max_array", "max_bytes", "max_hashes")

    def __init__(self, max_bytes: int = 64 << 20, max_array: int = 1 << 20, max_hashes: int = 1 << 17) -> None:
        self.max_bytes = max_bytes
        self.max_array = max_array
        self.max_hashes = max_hashes


DEFAULT_LIMITS = Limits()


def unpack(payload: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    if len(payload) > limits.max_bytes:
        raise DecodeError("too_large", f"payload of {len(payload)} bytes")
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            max_array_len=limits.max_array,
            max_map_len=4096,
            max_str_len=1 << 20,
            max_bin_len=1 << 20,
            max_ext_len=0,
        )
    except ValueError as exc:
        # msgpack reports both limit violations and garbage as ValueError subclasses.
        reason = "too_large" if "exceeds max" in str(exc) else "msgpack"
        raise DecodeError(reason, type(exc).__name__) from None
    except Exception as exc:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ...
        raise DecodeError("msgpack", type(exc).__name__) from None


def decode_batch(payload: bytes, limits: Limits = DEFAULT_LIMITS, *, block_size: int | None = None) -> Batch:
    """Decode one payload frame. `block_size`, when configured for the source, is the only
    full-block size accepted (vLLM partial blocks may be smaller)."""
    raw = unpack(payload, limits)
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank", raw.get("attn_dp_rank"))
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise DecodeError("schema", "payload is not a KVEventBatch")
    if type(ts) not in (float, int) or not isinstance(events, list):
        raise DecodeError("schema", "batch ts/events have the wrong type")
    if rank is not None and type(rank) is not int:
        raise DecodeError("schema", "batch rank is not an integer")
    batch = Batch(float(ts), rank, [])  # type: ignore[arg-type]  # checked just above
    for raw_event in events:
        try:
            _decode_event(raw_event, batch, limits, block_size)
        except DecodeError as exc:
            batch.skip(exc.reason)
    return batch


def _fields(raw: Any, names: tuple[str, ...], known: frozenset[str], batch: Batch) -> tuple[str, dict[str, Any]]:
    """(tag, {field: value}) for an array- or map-encoded event."""
    if isinstance(raw, list) and raw and type(raw[0]) is str:
        values = raw[1:]
        if len(values) > len(names):
            batch.unknown_fields += len(values) - len(names)
        return raw[0], dict(zip(names, values, strict=False))
    if isinstance(raw, dict):
        tag = raw.get("type")
        if type(tag) is not str:
            raise DecodeError("schema", "map event without a string type")
        unknown = sum(1 for key in raw if key not in known)
        if unknown:
            batch.unknown_fields += unknown
        return tag, raw
    raise DecodeError("schema", "event is neither a tagged array nor a tagged map")


def _tag(raw: Any) -> str:
    if isinstance(raw, list) and raw and type(raw[0]) is str:
        return str(raw[0])
    if isinstance(raw, dict) and type(raw.get("type")) is str:
        return str(raw["type"])
    raise DecodeError("schema", "event is neither a tagged array nor a tagged map")


def _decode_event(raw: Any, batch: Batch, limits: Limits, block_size: int | None) -> None:
    tag = _tag(raw)
    if tag == "BlockStored":
        _, f = _fields(raw, STORED_FIELDS, _STORED_KEYS, batch)
        if _main_attention(f):
            batch.events.append(_stored(f, limits, block_size))
        else:
            batch.skip("attention_group")
    elif tag == "BlockRemoved":
        _, f = _fields(raw, REMOVED_FIELDS, _REMOVED_KEYS, batch)
        if _main_attention(f):
            batch.events.append(Removed(_hashes(f.get("block_hashes"), limits), _medium(f.get("medium"))))
        else:
            batch.skip("attention_group")
    elif tag == "AllBlocksCleared":
        batch.events.append(Cleared())
    else:
        raise DecodeError("unknown_tag")


def _main_attention(f: dict[str, Any]) -> bool:
    """Dynamo's rule (spec §4.1): with a spec kind, keep main-attention kinds; without one,
    keep group 0 (events before group_idx existed are single-group)."""
    kind = f.get("kv_cache_spec_kind")
    if kind is not None:
        if type(kind) is not str:
            raise DecodeError("schema", "kv_cache_spec_kind is not a string")
        return kind in MAIN_ATTENTION_KINDS
    group = f.get("group_idx")
    if group is not None and type(group) is not int:
        raise DecodeError("schema", "group_idx is not an integer")
    return not group


def _hashes(value: Any, limits: Limits) -> list[int]:
    if not isinstance(value, list) or not value:
        raise DecodeError("schema", "block_hashes is not a non-empty array")
    if len(value) > limits.max_hashes:
        raise DecodeError("too_large", "too many block hashes in one event")
    return [norm_hash(h) for h in value]


def _medium(value: Any) -> str:
    if value is None:
        return GPU
    if type(value) is not str or len(value) > 64:
        raise DecodeError("schema", "medium is not a string")
    return value.upper()


def _stored(f: dict[str, Any], limits: Limits, expected_block_size: int | None) -> Stored:
    hashes = _hashes(f.get("block_hashes"), limits)
    parent_raw = f.get("parent_block_hash")
    parent = None if parent_raw is None else norm_hash(parent_raw)
    tokens = f.get("token_ids")
    size = f.get("block_size")
    if not isinstance(tokens, list) or type(size) is not int or size < 0:
        raise DecodeError("schema", "token_ids / block_size have the wrong type")
    lora_name = f.get("lora_name")
    if lora_name is not None and type(lora_name) is not str:
        raise DecodeError("schema", "lora_name is not a string")
    medium = _medium(f.get("medium"))
    n = len(hashes)
    if not tokens and size == 0:
        # Offload placeholder (kv-events-spec §1.5): identity only, never fed to a token chain.
        return Stored(hashes, parent, [0] * n, [], False, False, medium, None, lora_name, placeholder=True)
    # Seed "엔진별 block_size 처리": a normal event carries block_size tokens per hash. vLLM's
    # partial-block path sends one hash with a shorter block_size, which satisfies the same rule.
    ok = bool(tokens) and size > 0 and len(tokens) == size * n
    if ok and expected_block_size is not None:
        ok = size == expected_block_size or (n == 1 and size < expected_block_size)
    if ok:
        spans = [size] * n
    else:
        total = len(tokens) if tokens else size * n
        spans = [total // n] * n
        spans[-1] += total - (total // n) * n
    salts: list[str | None] | None = None
    if parent is None:
        salt = salt_candidate(f.get("extra_keys"), lora_name)
        if salt is not None:
            salts = [salt]
    return Stored(hashes, parent, spans, tokens, ok, bool(tokens) and not ok, medium, salts, lora_name, block_size=size)
