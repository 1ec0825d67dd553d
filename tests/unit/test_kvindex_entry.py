"""The pure entry model: stamps order like (epoch, seq), field writes per event type and
policy, last-writer-wins application, watermarks, key layout."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum_common.errors import ConfigError
from continuum_common.events import EventType, KvEvent, Tier
from continuum_common.kvindex.entry import (
    COPY_GPU,
    NO_STAMP,
    NOT_HELD,
    EntryState,
    FieldWrites,
    TierPolicy,
    apply_writes,
    event_writes,
    make_stamp,
)
from continuum_common.kvindex.keys import KeyLayout

U64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


@given(U64, U64, U64, U64)
def test_stamp_order_is_numeric_order(e1: int, s1: int, e2: int, s2: int) -> None:
    assert (make_stamp(e1, s1) < make_stamp(e2, s2)) == ((e1, s1) < (e2, s2))
    assert make_stamp(0, 0) > NO_STAMP > ""


def ev(etype: EventType, tokens: int = 10, tier: Tier = Tier.GPU_HOT) -> KvEvent:
    return KvEvent("a", 1, 1, 0.0, etype, "0" * 64, tokens, tier)


OFF, TRACK, TRACK_NO_OFFLOAD = TierPolicy(), TierPolicy(True, True), TierPolicy(True, False)


@pytest.mark.parametrize(
    ("event", "policy", "writes"),
    [
        (ev(EventType.CREATED), OFF, FieldWrites(gpu=10)),
        (ev(EventType.UPDATED, tier=Tier.STORAGE_WARM), OFF, None),
        (ev(EventType.UPDATED, tier=Tier.STORAGE_WARM), TRACK, FieldWrites(warm=10)),
        (ev(EventType.OFFLOADED), OFF, FieldWrites(gpu=NOT_HELD)),
        (ev(EventType.OFFLOADED, 0), TRACK, FieldWrites(gpu=NOT_HELD, warm=COPY_GPU)),
        (ev(EventType.EVICTED), OFF, FieldWrites(gpu=NOT_HELD)),
        (ev(EventType.EVICTED), TRACK, FieldWrites(gpu=NOT_HELD, warm=10)),
        (ev(EventType.EVICTED), TRACK_NO_OFFLOAD, FieldWrites(gpu=NOT_HELD)),
        (ev(EventType.EVICTED, tier=Tier.STORAGE_WARM), TRACK, FieldWrites(warm=NOT_HELD)),
        (ev(EventType.EVICTED, tier=Tier.STORAGE_WARM), OFF, None),
    ],
)
def test_event_writes(event: KvEvent, policy: TierPolicy, writes: FieldWrites | None) -> None:
    assert event_writes(event, policy) == writes


def test_cleared_is_not_an_entry_write() -> None:
    with pytest.raises(ValueError):
        event_writes(KvEvent("a", 1, 1, 0.0, EventType.CLEARED, None), OFF)


def test_last_writer_wins_per_field_and_watermark() -> None:
    s1, s2, s3 = make_stamp(1, 1), make_stamp(1, 2), make_stamp(1, 3)
    state, wrote = apply_writes(EntryState(), s2, FieldWrites(gpu=100))
    assert wrote and state.holding() == (100, Tier.GPU_HOT)
    same, wrote = apply_writes(state, s1, FieldWrites(gpu=5, warm=5))  # warm is older-than-nothing: written
    assert wrote and same.gpu_tokens == 100 and same.warm_tokens == 5
    moved, _ = apply_writes(state, s3, FieldWrites(gpu=NOT_HELD, warm=COPY_GPU))
    assert moved.holding() == (100, Tier.STORAGE_WARM)
    cleared = moved.under_watermark(make_stamp(2, 0))
    assert cleared.holding() is None and cleared.gpu_stamp == make_stamp(2, 0)
    assert apply_writes(cleared, s3, FieldWrites(gpu=1)) == (cleared, False)
    assert moved.expired().holding() is None and moved.expired().warm_stamp == moved.warm_stamp


def test_key_layout_keeps_a_prefix_in_one_slot() -> None:
    from redis.crc import key_slot

    keys = KeyLayout("cr:kvidx:")
    h = "ab" * 32
    holders, warm, meta = keys.entry_keys(h)
    assert holders == f"cr:kvidx:{h}"
    assert key_slot(holders.encode()) == key_slot(warm.encode()) == key_slot(meta.encode())
    assert all(k.startswith("cr:kvidx:") for k in (warm, meta, keys.lru, keys.reverse("b"), keys.watermark("b")))
    with pytest.raises(ConfigError):
        KeyLayout("cr:{kv}:")
