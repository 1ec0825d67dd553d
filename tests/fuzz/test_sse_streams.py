"""Hostile server-sent-event streams against the SSE consumers (the splitter they share,
continuum_common.sse, has its own properties in tests/unit/test_sse.py):

* the KV index's SSE transport (`continuum_common.kvindex.sse`: SseParser + record_to_event),
* the response cache's stream recorder (`continuum_ingress.cache.protocol.sse.StreamRecorder`).

Streams are generated from a model (records or events with their fields) and written with a
random line end per line (CR, LF or CRLF; the SSE specification allows mixing them), then cut
into random chunks. Properties: every chunking gives what the unchunked stream gives, which is
what the model says; over-long streams hit the documented limit with the
documented error; random bytes raise nothing but that error.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from continuum_common.events import decode_event
from continuum_common.kvindex.sse import (
    SseEventError,
    SseLimitError,
    SseParser,
    SseRecord,
    parse_body,
    record_to_event,
    record_type,
)
from continuum_ingress.cache.protocol.sse import SseDialect, StreamRecorder
from tests.fuzz.strategies import chunkings, dump_json, fuzz_settings, hostile_values, line_ends

PREFIX = hashlib.sha256(b"p").hexdigest()
# Field values: any text without a line end (surrogates cannot be written as UTF-8).
values = st.text(st.characters(exclude_characters="\r\n", exclude_categories=("Cs",)), max_size=30)


def join_lines(lines: list[bytes], ends: list[bytes]) -> bytes:
    """Lines with their line ends. A blank line may not end in LF right after a line ended by a
    lone CR: the two would read as one CRLF (the stream would say something else)."""
    out = bytearray()
    previous = b""
    for line, drawn in zip(lines, ends, strict=True):
        end = b"\r\n" if not line and previous == b"\r" and drawn == b"\n" else drawn
        out += line + end
        previous = end
    return bytes(out)


@st.composite
def written(draw: st.DrawFn, lines: list[bytes]) -> bytes:
    return join_lines(lines, [draw(line_ends) for _ in lines])


def feed_all(feed: Any, chunks: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for chunk in chunks:
        out += feed(chunk)
    return out


# -- KV index SSE transport ---------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    name: str  # "data", "event", "id", "retry", ":" (a comment), "bare-data" (the line "data"), or unknown
    value: str

    def line(self) -> bytes:
        if self.name == ":":
            return b":" + self.value.encode()
        if self.name == "bare-data":
            return b"data"
        return self.name.encode() + b": " + self.value.encode()


fields = st.builds(
    Field, st.sampled_from(["data", "data", "data", "event", "id", "retry", ":", "bare-data", "x-other"]), values
)
kv_records = st.lists(st.lists(fields, max_size=5), min_size=1, max_size=6)


def expected_records(records: list[list[Field]]) -> list[SseRecord]:
    """What the WHATWG rules make of the records (the oracle)."""
    out, last_id = [], None
    for record in records:
        event, data = None, []
        for field in record:
            if field.name == "data":
                data.append(field.value)
            elif field.name == "bare-data":
                data.append("")
            elif field.name == "event":
                event = field.value
            elif field.name == "id" and "\x00" not in field.value:
                last_id = field.value
        if data:
            out.append(SseRecord(event or None, "\n".join(data), last_id))
    return out


def record_lines(records: list[list[Field]]) -> list[bytes]:
    return [line for record in records for line in [*(f.line() for f in record), b""]]


@fuzz_settings(2.0)
@given(records=kv_records, data=st.data())
@example(records=[[Field("data", "a"), Field("data", "c")]], data=None).via("an empty chunk between CR and LF")
def test_kv_sse_parser_any_chunking_any_line_ends(records: list[list[Field]], data: st.DataObject | None) -> None:
    if data is None:
        chunks = [b"data: a\r", b"", b"\ndata: c\n\n"]
    else:
        stream = data.draw(written(record_lines(records)), label="stream")
        chunks = data.draw(chunkings(stream), label="chunks")
    assert feed_all(SseParser().feed, chunks) == expected_records(records)


@fuzz_settings(1.0)
@given(
    stream=st.binary(max_size=600)
    | st.lists(st.sampled_from([b"\r", b"\n", b"data:", b"id: 1:2", b" ", b"x"])).map(b"".join),
    data=st.data(),
)
def test_kv_sse_parser_random_bytes(stream: bytes, data: st.DataObject) -> None:
    whole = SseParser(max_buffer=256)
    try:
        expected = whole.feed(stream)
    except SseLimitError:
        expected = None
    parser = SseParser(max_buffer=256)
    try:
        got = feed_all(parser.feed, data.draw(chunkings(stream), label="chunks"))
    except SseLimitError:
        got = None
    assert got == expected


_bodies = st.one_of(
    st.fixed_dictionaries(
        {"prefix_hash": st.just(PREFIX)},
        optional={
            "token_count": hostile_values,
            "tier": st.sampled_from(["gpu_hot", "storage", "GPU", "warm", "hot"]) | hostile_values,
            "source_epoch": hostile_values,
            "seq": hostile_values,
            "ts": hostile_values,
            "backend": st.sampled_from(["b", "c"]),
            "event": st.sampled_from(["cache_created", "evicted", "cleared", "nope"]),
        },
    ),
    hostile_values,
)
_ids = st.none() | st.sampled_from(["1:2", "b:3:4", "99999999999999999999:1", "1:18446744073709551616", "0:0"]) | values


@fuzz_settings(1.0)
@given(
    body=_bodies, name=st.none() | st.sampled_from(["cache_created", "cache_evicted", "cache_cleared", "x"]), id_=_ids
)
@example(body={"prefix_hash": PREFIX}, name="cache_created", id_="99999999999999999999:1").via(
    "an id stamp past uint64"
)
def test_kv_sse_record_to_event(body: Any, name: str | None, id_: str | None) -> None:
    record = SseRecord(name, dump_json(body).decode(), id_)
    parsed = parse_body(record)
    record_type(record, parsed)
    try:
        event = record_to_event(record, parsed, backend="b", arrival=(7, 9), now=1.0)
    except SseEventError as exc:
        assert exc.reason in ("invalid", "unknown_type", "backend_mismatch")
        return
    # What the SSE transport hands the index is a normalized event, bounds included.
    assert decode_event(event.encode()) == event


# -- response cache stream recorder -------------------------------------------------------------

OPENAI_CHUNK = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}


@dataclass(frozen=True)
class CacheEvent:
    lines: tuple[bytes, ...]  # without line ends; the event ends with a blank line
    terminal: bool = False
    error: bool = False


# Per dialect that names its events: (ordinary events, events that spoil the stream), and the
# events that end it.
NAMED_EVENTS = {
    SseDialect.ANTHROPIC: ([b"message_start", b"content_block_delta", b"ping"], [b"error"]),
    SseDialect.RESPONSES: (
        [b"response.created", b"response.output_text.delta", b"response.output_item.done"],
        [b"error", b"response.failed"],
    ),
}
TERMINALS = {
    SseDialect.ANTHROPIC: [b"message_stop"],
    SseDialect.RESPONSES: [b"response.completed", b"response.incomplete"],
}


@st.composite
def cache_streams(draw: st.DrawFn, dialect: SseDialect) -> tuple[list[CacheEvent], bool]:
    """(events, whether the stream is complete and clean) for one dialect."""
    events: list[CacheEvent] = []
    for _ in range(draw(st.integers(0, 4))):
        comment = [b": keep-alive"] if draw(st.booleans()) else []
        if dialect is SseDialect.OPENAI:
            payload = {**OPENAI_CHUNK, "n": draw(st.integers(0, 9))}
            error = draw(st.integers(0, 9)) == 0
            if error:
                payload = {"error": {"message": "boom"}}
            events.append(CacheEvent((*comment, b"data: " + orjson.dumps(payload)), error=error))
        else:
            names, failures = NAMED_EVENTS[dialect]
            name = draw(st.sampled_from([*names, *failures]))
            events.append(CacheEvent((*comment, b"event: " + name, b'data: {"type": "x"}'), error=name in failures))
    terminal = draw(st.booleans())
    if terminal:
        if dialect is SseDialect.OPENAI:
            last: tuple[bytes, ...] = (b"data: [DONE]",)
        else:
            last = (b"event: " + draw(st.sampled_from(TERMINALS[dialect])), b'data: {"type": "s"}')
        events.append(CacheEvent(last, terminal=True))
    clean = terminal and not any(e.error for e in events)
    return events, clean


def cache_lines(events: list[CacheEvent]) -> list[list[bytes]]:
    return [[*e.lines, b""] for e in events]


@fuzz_settings(2.0)
@given(dialect=st.sampled_from(list(SseDialect)), data=st.data(), trailing=st.sampled_from([b"", b"\n", b"\r\n\r\n"]))
def test_stream_recorder_any_chunking_any_line_ends(dialect: SseDialect, data: st.DataObject, trailing: bytes) -> None:
    events, clean = data.draw(cache_streams(dialect), label="events")
    raws = [data.draw(written(lines), label="event") for lines in cache_lines(events)]
    if raws and raws[-1].endswith(b"\r") and trailing.startswith(b"\n"):
        trailing = b""  # it would complete a CRLF, not add a blank line
    stream = b"".join(raws) + trailing
    recorder = StreamRecorder(dialect, 1 << 20)
    for chunk in data.draw(chunkings(stream), label="chunks"):
        recorder.feed(chunk)
    entry = recorder.finish()
    assert (entry is not None) == clean, recorder.failure
    if entry is not None:
        assert b"".join(entry.events) == stream  # replay is byte-identical
        assert list(entry.events[:-1]) == raws[:-1]  # one stored event per SSE event
        assert entry.events[-1] == raws[-1] + trailing


@fuzz_settings(1.0)
@given(dialect=st.sampled_from(list(SseDialect)), data=st.data(), limit=st.integers(1, 400))
def test_stream_recorder_size_limit(dialect: SseDialect, data: st.DataObject, limit: int) -> None:
    events, clean = data.draw(cache_streams(dialect), label="events")
    stream = b"".join(data.draw(written(lines)) for lines in cache_lines(events))
    recorder = StreamRecorder(dialect, limit)
    for chunk in data.draw(chunkings(stream), label="chunks"):
        recorder.feed(chunk)
    entry = recorder.finish()
    if len(stream) > limit:
        assert entry is None  # oversized, unless an error event already spoiled it
        assert recorder.failure == "oversized" or any(e.error for e in events)
    else:
        assert (entry is not None) == clean


@fuzz_settings(1.0)
@given(dialect=st.sampled_from(list(SseDialect)), stream=st.binary(max_size=500), data=st.data())
def test_stream_recorder_random_bytes(dialect: SseDialect, stream: bytes, data: st.DataObject) -> None:
    whole = StreamRecorder(dialect, 1 << 20)
    whole.feed(stream)
    expected = whole.finish()
    recorder = StreamRecorder(dialect, 1 << 20)
    for chunk in data.draw(chunkings(stream), label="chunks"):
        recorder.feed(chunk)
    got = recorder.finish()
    assert (got is None) == (expected is None)
    if got is not None and expected is not None:
        assert got.events == expected.events
