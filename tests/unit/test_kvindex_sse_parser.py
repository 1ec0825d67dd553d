"""The SSE parser and the SSE-record → KvEvent mapping (pure)."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum_common.events import EventType, Tier
from continuum_common.kvindex.sse import (
    SseEventError,
    SseLimitError,
    SseParser,
    SseRecord,
    parse_body,
    record_to_event,
)

P = hashlib.sha256(b"p").hexdigest()
STREAM = (
    b": hello\r\n"
    b'id: 1:1\r\nevent: cache_created\r\ndata: {"prefix_hash": "' + P.encode() + b'"}\r\n\r\n'
    b"data: line one\ndata: line two\n\n"
    b"id: 1:3\rdata: x\r\r"
    b"event: only-event\n\n"
    b"data\n\n"
)


def parse_all(chunks: list[bytes]) -> list[SseRecord]:
    parser = SseParser()
    out: list[SseRecord] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out


def test_fields_line_endings_and_ids() -> None:
    records = parse_all([STREAM])
    assert [r.event for r in records] == ["cache_created", None, None, None]
    assert records[0].id == "1:1" and records[1].id == "1:1" and records[2].id == "1:3"
    assert records[1].data == "line one\nline two"
    assert records[3].data == ""  # a bare `data` field is an empty data line


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
def test_any_chunking_gives_the_same_records(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert parse_all(chunks) == parse_all([STREAM])


def test_limits() -> None:
    parser = SseParser(max_buffer=100)
    with pytest.raises(SseLimitError):
        parser.feed(b"data: " + b"a" * 200)
    parser = SseParser(max_buffer=100)
    parser.feed(b"data: " + b"a" * 60 + b"\n")
    with pytest.raises(SseLimitError):
        parser.feed(b"data: " + b"a" * 60 + b"\n")
    parser = SseParser(max_buffer=100)
    for _ in range(10):  # records that end stay within the limit however many there are
        assert len(parser.feed(b"data: " + b"a" * 60 + b"\n\n")) == 1


def js(**fields: object) -> str:
    return orjson.dumps(fields).decode()


def event_of(record: SseRecord, backend: str = "a"):  # type: ignore[no-untyped-def]
    return record_to_event(record, parse_body(record), backend=backend, arrival=(9, 99), now=5.0)


def test_mapping_and_precedence() -> None:
    e = event_of(SseRecord("cache_created", js(event="cache_evicted", prefix_hash=P.upper()), "3:4"))
    assert (e.type, e.prefix_hash, e.source_epoch, e.seq, e.ts, e.tier) == (
        EventType.CREATED,
        P,
        3,
        4,
        5.0,
        Tier.GPU_HOT,
    )
    e = event_of(
        SseRecord(
            None,
            js(type="offloaded", prefix_hash=P, token_count=7, tier="StorageWarm", source_epoch=1, seq=2, ts=1.5),
            "x",
        )
    )
    assert (e.type, e.token_count, e.tier, e.source_epoch, e.seq, e.ts) == (
        EventType.OFFLOADED,
        7,
        Tier.STORAGE_WARM,
        1,
        2,
        1.5,
    )
    e = event_of(SseRecord("cache_cleared", "{}", "17"))
    assert (e.type, e.prefix_hash, e.source_epoch, e.seq) == (EventType.CLEARED, None, 9, 99)  # arrival stamp
    e = event_of(SseRecord(None, js(event="cache_updated", prefix_hash=P), "a:4:5"))
    assert (e.source_epoch, e.seq) == (4, 5)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (SseRecord(None, "not json", None), "invalid"),
        (SseRecord(None, js(event="cache_created"), None), "invalid"),
        (SseRecord(None, js(event="cache_created", prefix_hash=P, token_count=-1), None), "invalid"),
        (SseRecord(None, js(event="cache_created", prefix_hash=P, tier="tape"), None), "invalid"),
        (SseRecord("message", js(prefix_hash=P), None), "unknown_type"),
        (
            SseRecord(None, js(event="cache_created", prefix_hash=P, backend="b"), None),
            "backend_mismatch",
        ),
    ],
)
def test_invalid_records(record: SseRecord, reason: str) -> None:
    with pytest.raises(SseEventError) as err:
        event_of(record)
    assert err.value.reason == reason
