"""TensorRT-LLM `POST /kv_cache_events` bodies → engine-neutral events (kv-events-spec §3.2).

The body is a JSON array of `{event_id, data, window_size?, attention_dp_rank?, hash_algo?,
layer_group_id?}`. IDs and hashes are uint64 (parsed exactly: orjson keeps every integer up to
2^64-1 as an int, and anything larger becomes a float, which is rejected) or, with the v2 KV cache
manager, hex strings. For prefix keys tokens are not needed (TRT-LLM sources are salt-only: no
public /detokenize), so only each block's token count is read; block mode (`keep_tokens`) keeps
the token ids too, to re-key blocks by content (policy.rekey).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from continuum_listener.errors import DecodeError
from continuum_listener.protocol.model import (
    TRT_LEVEL_MEDIA,
    Cleared,
    EngineEvent,
    Moved,
    Removed,
    Stored,
    norm_hash,
)

MAX_EVENTS = 100_000
MAX_BLOCKS = 1 << 17
_U32 = 1 << 32


@dataclass(slots=True)
class TrtEvent:
    event_id: int
    rank: int
    window: int | None
    events: list[EngineEvent]  # empty for a no-op (priority-only update)
    created: bool = False
    reason: str | None = None  # set when `data` was unusable; the event_id is still consumed


@dataclass(slots=True)
class TrtBody:
    events: list[TrtEvent]
    skipped: dict[str, int] = field(default_factory=dict)


def _uint(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise DecodeError("schema", f"{what} is not a non-negative integer")
    return int(value)


def level_medium(level: Any) -> str:
    if type(level) is not int or level < 0:
        raise DecodeError("schema", "cache_level is not a non-negative integer")
    return TRT_LEVEL_MEDIA[min(level, len(TRT_LEVEL_MEDIA) - 1)]


def decode_body(body: bytes, *, keep_tokens: bool = False) -> TrtBody:
    """Parse one drain response; DecodeError when the body is not a JSON array. `keep_tokens`
    fills each Stored's token_ids (one int per token) and `unkeyed`."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise DecodeError("json", "body is not JSON") from None
    if not isinstance(raw, list):
        raise DecodeError("schema", "body is not a JSON array")
    if len(raw) > MAX_EVENTS:
        raise DecodeError("too_large", "too many events in one response")
    out = TrtBody([])
    for item in raw:
        if not isinstance(item, dict):
            out.skipped["schema"] = out.skipped.get("schema", 0) + 1
            continue
        try:
            event_id = _uint(item.get("event_id"), "event_id")
            rank = item.get("attention_dp_rank", 0)
            rank = 0 if rank is None else _uint(rank, "attention_dp_rank")
            window = item.get("window_size")
            window = None if window is None else _uint(window, "window_size")
        except DecodeError as exc:
            out.skipped[exc.reason] = out.skipped.get(exc.reason, 0) + 1
            continue
        event = TrtEvent(event_id, rank, window, [])
        try:
            _decode_data(item.get("data"), event, keep_tokens)
        except DecodeError as exc:
            event.events = []
            event.reason = exc.reason
        out.events.append(event)
    return out


def _decode_data(data: Any, event: TrtEvent, keep_tokens: bool) -> None:
    if not isinstance(data, dict) or type(data.get("type")) is not str:
        raise DecodeError("schema", "event data has no type")
    kind = data["type"]
    if kind == "created":
        event.created = True
        event.events.append(Cleared())
    elif kind == "stored":
        event.events.extend(_stored(data, keep_tokens))
    elif kind == "removed":
        hashes = data.get("block_hashes")
        if not isinstance(hashes, list) or len(hashes) > MAX_BLOCKS:
            raise DecodeError("schema", "block_hashes is not an array")
        if hashes:
            event.events.append(Removed([norm_hash(h) for h in hashes], None))
    elif kind == "updated":
        diff = data.get("cache_level")
        block = norm_hash(data.get("block_hash"))
        if diff is not None:
            if not isinstance(diff, dict):
                raise DecodeError("schema", "cache_level diff is not an object")
            old, new = level_medium(diff.get("old_value")), level_medium(diff.get("new_value"))
            if old != new:
                event.events.append(Moved(block, old, new))
    else:
        raise DecodeError("unknown_tag")


def _token_ids(tokens: list[Any]) -> list[int] | None:
    """The block's token ids; None when one is not a plain uint32 text token: a multimodal or
    prompt-table token has a non-zero token_extra_id (its id alone does not name the content),
    and the v2 cache manager may send string ids."""
    out: list[int] = []
    for token in tokens:
        if not isinstance(token, dict):
            return None
        token_id = token.get("token_id")
        if type(token_id) is not int or not 0 <= token_id < _U32 or token.get("token_extra_id", 0):
            return None
        out.append(token_id)
    return out


def _stored(data: dict[str, Any], keep_tokens: bool = False) -> list[EngineEvent]:
    """One `stored` event becomes one Stored per run of blocks on the same cache level."""
    parent_raw = data.get("parent_hash")
    parent = None if parent_raw is None else norm_hash(parent_raw)
    blocks = data.get("blocks")
    if not isinstance(blocks, list) or not blocks or len(blocks) > MAX_BLOCKS:
        raise DecodeError("schema", "blocks is not a non-empty array")
    runs: list[EngineEvent] = []
    current: Stored | None = None
    for block in blocks:
        if not isinstance(block, dict):
            raise DecodeError("schema", "block is not an object")
        block_hash = norm_hash(block.get("block_hash"))
        tokens = block.get("tokens")
        if not isinstance(tokens, list):
            raise DecodeError("schema", "block tokens is not an array")
        medium = level_medium(block.get("cache_level", 0))
        salt = block.get("cache_salt", block.get("cacheSalt"))
        if salt is not None and type(salt) is not str:
            raise DecodeError("schema", "cache_salt is not a string")
        if current is None or current.medium != medium:
            current = Stored([], parent, [], [], False, False, medium, [])
            runs.append(current)
        if keep_tokens:
            ids = _token_ids(tokens)
            if ids is None:
                current.unkeyed = (*current.unkeyed, len(current.hashes))
                ids = [0] * len(tokens)
            current.token_ids.extend(ids)
        current.hashes.append(block_hash)
        current.spans.append(len(tokens))
        current.block_size = max(current.block_size, len(tokens))
        assert current.salts is not None
        current.salts.append(salt)
        parent = block_hash
    return runs
