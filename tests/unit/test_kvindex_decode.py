"""decode_event (sped up for the indexer's hot path) still refuses every malformed map with
EventDecodeError and nothing else, and round-trips every valid event."""

from __future__ import annotations

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from continuum_common.events import EventDecodeError, EventType, KvEvent, Tier, decode_event

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1), st.floats(allow_nan=False),
    st.text(max_size=70), st.lists(st.integers(-9, 9), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2),
    st.sampled_from(["created", "cleared", "gpu_hot", "storage_warm", "a" * 64, "a"]),
)  # fmt: skip
FIELDS = ("v", "backend", "source_epoch", "seq", "ts", "type", "prefix_hash", "token_count", "tier")


@given(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=9))
def test_malformed_maps_raise_only_decode_errors(data: dict[str, object]) -> None:
    base = {"v": 1, "backend": "a", "source_epoch": 1, "seq": 1, "ts": 1.0, "type": "created", "prefix_hash": "a" * 64}
    try:
        event = decode_event(msgpack.packb({**base, **data}))
    except EventDecodeError:
        return
    assert isinstance(event, KvEvent) and event.type in EventType and event.tier in Tier


@given(
    st.sampled_from(list(EventType)),
    st.sampled_from(list(Tier)),
    st.integers(min_value=0, max_value=2**63),
    st.integers(min_value=0, max_value=2**63),
)
def test_valid_events_round_trip(etype: EventType, tier: Tier, epoch: int, seq: int) -> None:
    p = None if etype is EventType.CLEARED else "b" * 64
    event = KvEvent("vllm-1", epoch, seq, 12.5, etype, p, 7, tier)
    assert decode_event(event.encode()) == event
