"""Engine events → version-2 block events (continuum_common.wire.kv), pure.

* vLLM / SGLang: the engine's own block hashes, already normalized to u64 by the decoder
  (`model.norm_hash`), are published as they are:

  | engine event | block event |
  |---|---|
  | BlockStored | BlocksStored(hashes in chain order, parent, block_tokens = block_size, tier of the medium) |
  | BlockStored placeholder (`token_ids == []`, `block_size == 0`) | BlocksStored(tier of the medium, block_tokens 0) |
  | BlockStored of a vLLM partial block (block_size below the source's) | left out, counted `partial_block` |
  | BlockRemoved | BlocksRemoved(tier of the medium) |
  | AllBlocksCleared | AllCleared |

* Adjacent events that say the same thing more compactly are merged, order preserved: removals
  of one tier, and stores that continue each other's chain (same tier and block size). SGLang's
  one-event-per-page stream becomes one BlocksStored per radix node this way, and vLLM's
  one-hash GPU evictions one BlocksRemoved per batch.
* `split` cuts a batch's events into chunks that stay under the wire bounds and a NATS message's
  size (a store split in two keeps its chain: the second part's parent is the first part's last
  hash).
* `content_digest` / `content_key`: the content hash the listener gives TensorRT-LLM blocks
  (whose own hashes cannot be recomputed by the ingress): `d_i = sha256(d_{i-1} || tokens as
  uint32 little-endian)`, no prior digest at the root, key = first 8 digest bytes as an unsigned
  big-endian integer — SGLang's formula, which the ingress's precise mode computes for a
  TensorRT-LLM group (continuum_common.hashing.blocks, engine "trtllm").
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from typing import Final

from continuum_common.wire.kv import (
    MAX_EVENTS_PER_BATCH,
    TIER_GPU,
    TIER_STORAGE,
    AllCleared,
    BlockEvent,
    BlocksRemoved,
    BlocksStored,
)
from continuum_listener.protocol.model import GPU_MEDIA, Cleared, EngineEvent, Removed, Stored

# Wire bytes per hash in the worst case (msgpack uint64) and a margin for the batch envelope.
HASH_WIRE_BYTES: Final = 9
ENVELOPE_BYTES: Final = 1024
DEFAULT_MAX_HASHES: Final = 65_536


def medium_tier(medium: str | None) -> int:
    """0 (GPU memory) for GPU, DEVICE or no medium; 1 for every other medium."""
    if medium is None or medium.upper() in GPU_MEDIA:
        return TIER_GPU
    return TIER_STORAGE


def max_hashes_for(max_payload: int) -> int:
    """Hashes one bus message may carry without exceeding `max_payload` bytes."""
    return max(1, min(DEFAULT_MAX_HASHES, (max_payload - ENVELOPE_BYTES) // HASH_WIRE_BYTES))


class _Pending:
    """A block event still open for merging (msgspec structs are frozen)."""

    __slots__ = ("block_tokens", "hashes", "kind", "parent", "tier")

    def __init__(self, kind: int, hashes: list[int], parent: int | None, block_tokens: int, tier: int) -> None:
        self.kind = kind  # 1 stored, 2 removed, 3 cleared (the wire tags)
        self.hashes = hashes
        self.parent = parent
        self.block_tokens = block_tokens
        self.tier = tier


class EventBuilder:
    """Accumulates block events in order, merging where the result says the same thing."""

    __slots__ = ("_events", "blocks")

    def __init__(self) -> None:
        self._events: list[_Pending] = []
        self.blocks = 0  # hashes stored + removed

    def __len__(self) -> int:
        return len(self._events)

    def stored(self, hashes: list[int], parent: int | None, block_tokens: int, tier: int) -> None:
        if not hashes:
            return
        self.blocks += len(hashes)
        last = self._events[-1] if self._events else None
        if (
            last is not None
            and last.kind == 1
            and parent is not None
            and last.hashes[-1] == parent
            and last.block_tokens == block_tokens
            and last.tier == tier
        ):
            last.hashes.extend(hashes)
            return
        self._events.append(_Pending(1, list(hashes), parent, block_tokens, tier))

    def removed(self, hashes: list[int], tier: int) -> None:
        if not hashes:
            return
        self.blocks += len(hashes)
        last = self._events[-1] if self._events else None
        if last is not None and last.kind == 2 and last.tier == tier:
            last.hashes.extend(hashes)
            return
        self._events.append(_Pending(2, list(hashes), None, 0, tier))

    def cleared(self) -> None:
        if not self._events or self._events[-1].kind != 3:  # twice in a row says it once
            self._events.append(_Pending(3, [], None, 0, 0))

    def build(self) -> list[BlockEvent]:
        out: list[BlockEvent] = []
        for e in self._events:
            if e.kind == 1:
                out.append(BlocksStored(e.hashes, e.parent, e.block_tokens, e.tier))
            elif e.kind == 2:
                out.append(BlocksRemoved(e.hashes, e.tier))
            else:
                out.append(AllCleared())
        return out


class BlockMapper:
    """vLLM / SGLang events → block events for one source.

    `block_size` is the source's configured full-block size; without it the largest block size
    seen so far on the source is taken as the full size (a partial block that arrives before any
    full one then slips through once — configure block_size to be exact)."""

    __slots__ = ("configured", "learned")

    def __init__(self, block_size: int | None = None) -> None:
        self.configured = block_size
        self.learned = 0

    def map(self, events: Iterable[EngineEvent], out: EventBuilder, skipped: dict[str, int]) -> None:
        for event in events:
            if isinstance(event, Stored):
                self._stored(event, out, skipped)
            elif isinstance(event, Removed):
                out.removed(event.hashes, medium_tier(event.medium))
            elif isinstance(event, Cleared):
                out.cleared()
            # Moved comes from TensorRT-LLM only (policy.rekey handles it).

    def full_size(self, size: int) -> int:
        """The source's full block size, having seen a store of `size` tokens per block."""
        if self.configured is not None:
            return self.configured
        self.learned = max(self.learned, size)
        return self.learned

    def _stored(self, event: Stored, out: EventBuilder, skipped: dict[str, int]) -> None:
        tier = medium_tier(event.medium)
        if event.placeholder:
            out.stored(event.hashes, event.parent, 0, tier)
            return
        size = event.block_size
        if size < self.full_size(size):
            skipped["partial_block"] = skipped.get("partial_block", 0) + len(event.hashes)
            return
        out.stored(event.hashes, event.parent, size, tier)


def split(events: Sequence[BlockEvent], max_hashes: int) -> list[list[BlockEvent]]:
    """Chunks of at most `max_hashes` hashes and MAX_EVENTS_PER_BATCH events, in order, each
    filled before the next starts. The common case (a batch within bounds) returns the events
    as the only chunk."""
    total = 0
    for event in events:
        if not isinstance(event, AllCleared):
            total += len(event.hashes)
    if total <= max_hashes and len(events) <= MAX_EVENTS_PER_BATCH:
        return [list(events)]
    chunks: list[list[BlockEvent]] = [[]]
    room = max_hashes
    for event in events:
        if isinstance(event, AllCleared):
            if len(chunks[-1]) >= MAX_EVENTS_PER_BATCH:
                chunks.append([])
                room = max_hashes
            chunks[-1].append(event)
            continue
        hashes, start = event.hashes, 0
        while start < len(hashes):
            if room == 0 or len(chunks[-1]) >= MAX_EVENTS_PER_BATCH:
                chunks.append([])
                room = max_hashes
            take = min(room, len(hashes) - start)
            chunks[-1].append(_part(event, start, take))
            room -= take
            start += take
    return [c for c in chunks if c]


def _part(event: BlocksStored | BlocksRemoved, start: int, take: int) -> BlockEvent:
    """hashes[start:start + take] of `event`; a store's part keeps its chain (its parent is
    the hash before it)."""
    if start == 0 and take == len(event.hashes):
        return event
    hashes = event.hashes[start : start + take]
    if isinstance(event, BlocksRemoved):
        return BlocksRemoved(hashes, event.tier)
    parent = event.parent if start == 0 else event.hashes[start - 1]
    return BlocksStored(hashes, parent, event.block_tokens, event.tier)


def content_digest(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """sha256(parent digest || tokens as uint32 little-endian); struct.error for a token id
    outside uint32 (callers validate first)."""
    digest = hashlib.sha256()
    if parent is not None:
        digest.update(parent)
    digest.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return digest.digest()


def content_key(digest: bytes) -> int:
    """The u64 on the wire: the digest's first 8 bytes, unsigned big-endian."""
    return int.from_bytes(digest[:8], "big")
