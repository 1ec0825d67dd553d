"""The per-(prefix, backend) entry and how one event changes it. Pure; both index backends
(the Python InMemoryKvIndex and the Lua script of RedisKvIndex) implement exactly this.

An entry holds two fields, one per storage tier, each a last-writer-wins register stamped with
the `(source_epoch, seq)` of the event that wrote it:

    gpu  = (stamp, tokens)      tokens == NOT_HELD when the backend has no GPU copy
    warm = (stamp, tokens)      only used with `storage_offloading.enabled`

An event is translated (by `event_writes`) into values for one or both fields that do not depend
on the entry's current state, and a field is written only when the event's stamp is newer than
the field's. So the final entry is the value of the newest event per field, whatever the order,
duplication or batching of delivery: exactly the result of in-order, exactly-once delivery.

`cleared` does not touch entries directly: it raises the backend's *clear watermark*. Every
field stamped at or below the watermark reads as NOT_HELD, and events at or below it are stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from continuum_common.config.kv_index import KvCacheIndex
from continuum_common.events import EventType, KvEvent, Tier

NOT_HELD = -1
# `offloaded`/`evicted` without a token count: the warm copy gets the GPU copy's size. This is
# the one state-dependent write; listeners always send a count, so it is a fallback only.
COPY_GPU = -2

_STAMP_DIGITS = 20  # uint64 max has 20 decimal digits
# Below every real stamp ("-" sorts before "0"), so (epoch 0, seq 0) is newer than "never".
NO_STAMP = "-" * (2 * _STAMP_DIGITS)


def make_stamp(source_epoch: int, seq: int) -> str:
    """(epoch, seq) as a fixed-width string whose byte order is the numeric order. Lua numbers
    are doubles, so the Redis script compares these strings instead of 64-bit integers."""
    return f"{source_epoch:0{_STAMP_DIGITS}d}{seq:0{_STAMP_DIGITS}d}"


def event_stamp(event: KvEvent) -> str:
    return make_stamp(event.source_epoch, event.seq)


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """The seed's storage-tier rules (`kv_cache_index.storage_offloading`)."""

    track_tiers: bool = False
    evict_as_offload: bool = True

    @classmethod
    def from_config(cls, cfg: KvCacheIndex) -> TierPolicy:
        return cls(cfg.storage_offloading.enabled, cfg.storage_offloading.treat_eviction_as_offload)


class FieldWrites(NamedTuple):
    """New values for the entry's fields; None leaves a field alone. (A NamedTuple: one is
    made per event on the indexer's hot path.)"""

    gpu: int | None = None
    warm: int | None = None


def event_writes(event: KvEvent, policy: TierPolicy) -> FieldWrites | None:
    """The field writes of a non-`cleared` event, or None when the policy ignores it.

    created/updated (gpu)    gpu  <- token_count
    created/updated (warm)   warm <- token_count                    (tracking tiers only)
    offloaded                gpu  <- none, warm <- token_count       (without tracking: gpu <- none)
    evicted (gpu)            gpu  <- none, and warm <- token_count when eviction counts as an
                             offload (tracking tiers + treat_eviction_as_offload)
    evicted (warm)           warm <- none                            (tracking tiers only)
    """
    etype = event.type
    tokens = event.token_count
    if etype in (EventType.CREATED, EventType.UPDATED):
        if event.tier is Tier.GPU_HOT:
            return FieldWrites(gpu=tokens)
        return FieldWrites(warm=tokens) if policy.track_tiers else None
    if etype is EventType.OFFLOADED:
        if not policy.track_tiers:
            return FieldWrites(gpu=NOT_HELD)
        return FieldWrites(gpu=NOT_HELD, warm=tokens if tokens > 0 else COPY_GPU)
    if etype is EventType.EVICTED:
        if event.tier is Tier.STORAGE_WARM:
            return FieldWrites(warm=NOT_HELD) if policy.track_tiers else None
        if policy.track_tiers and policy.evict_as_offload:
            return FieldWrites(gpu=NOT_HELD, warm=tokens if tokens > 0 else COPY_GPU)
        return FieldWrites(gpu=NOT_HELD)
    raise ValueError(f"{etype} events change the backend's clear watermark, not an entry")


@dataclass(frozen=True, slots=True)
class EntryState:
    gpu_stamp: str = NO_STAMP
    gpu_tokens: int = NOT_HELD
    warm_stamp: str = NO_STAMP
    warm_tokens: int = NOT_HELD

    def holding(self) -> tuple[int, Tier] | None:
        """What a query reports for this backend: the GPU copy if there is one, else the warm one."""
        if self.gpu_tokens >= 0:
            return self.gpu_tokens, Tier.GPU_HOT
        if self.warm_tokens >= 0:
            return self.warm_tokens, Tier.STORAGE_WARM
        return None

    def under_watermark(self, watermark: str) -> EntryState:
        """Fields written at or before the backend's last clear read as not held."""
        gpu_stamp, gpu_tokens, warm_stamp, warm_tokens = (
            self.gpu_stamp,
            self.gpu_tokens,
            self.warm_stamp,
            self.warm_tokens,
        )
        if watermark > gpu_stamp:
            gpu_stamp, gpu_tokens = watermark, NOT_HELD
        if watermark > warm_stamp:
            warm_stamp, warm_tokens = watermark, NOT_HELD
        return EntryState(gpu_stamp, gpu_tokens, warm_stamp, warm_tokens)

    def expired(self) -> EntryState:
        """The holdings are gone (TTL) but the stamps stay, so stale redeliveries stay stale."""
        return EntryState(self.gpu_stamp, NOT_HELD, self.warm_stamp, NOT_HELD)


def apply_writes(state: EntryState, stamp: str, writes: FieldWrites) -> tuple[EntryState, bool]:
    """Write each field whose stamp is older than `stamp`; return the new state and whether
    anything was written. The caller applies the clear watermark first (`under_watermark`)."""
    gpu_stamp, gpu_tokens, warm_stamp, warm_tokens = (
        state.gpu_stamp,
        state.gpu_tokens,
        state.warm_stamp,
        state.warm_tokens,
    )
    wrote = False
    if writes.warm is not None and stamp > warm_stamp:
        value = writes.warm
        if value == COPY_GPU:
            value = state.gpu_tokens if state.gpu_tokens >= 0 else state.warm_tokens
        warm_stamp, warm_tokens, wrote = stamp, value, True
    if writes.gpu is not None and stamp > gpu_stamp:
        gpu_stamp, gpu_tokens, wrote = stamp, writes.gpu, True
    if not wrote:
        return state, False
    return EntryState(gpu_stamp, gpu_tokens, warm_stamp, warm_tokens), True
