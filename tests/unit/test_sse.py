"""continuum_common.sse, the one SSE splitter of the project (the KV SSE transport, the response
cache's stream recorder and the Gemini stream converters all read through it).

Streams are generated from a model (events made of fields) and written with a random line end
per line, then cut into random chunks. The oracle is the WHATWG event-stream processing model
applied to the model, so every property says what the specification says, not what the code does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from continuum_common.sse import SseEvent, SseLimitError, SseSplitter, regroup

BOM = b"\xef\xbb\xbf"
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
line_ends = st.sampled_from([b"\n", b"\r", b"\r\n"])
# Field values: any text without a line end (surrogates cannot be written as UTF-8).
values = st.text(st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]), max_size=20)


@dataclass(frozen=True)
class Field:
    # "data", "event", "id", "retry", "x-other", ":" (a comment), "bare-data" (the line `data`),
    # "spaced" (`data:  v`: only one space is stripped), "tight" (`data:v`: no space to strip)
    name: str
    value: str

    def line(self) -> bytes:
        value = self.value.encode()
        if self.name == ":":
            return b":" + value
        if self.name == "bare-data":
            return b"data"
        if self.name == "spaced":
            return b"data:  " + value
        if self.name == "tight":
            return b"data:" + value
        return self.name.encode() + b": " + value


fields = st.builds(
    Field,
    st.sampled_from(["data", "data", "event", "id", "retry", "x-other", ":", "bare-data", "spaced", "tight"]),
    values,
)
models = st.lists(st.lists(fields, max_size=5), min_size=1, max_size=6)


def expected(model: list[list[Field]]) -> list[tuple[str | None, str | None, str | None]]:
    """(event, data, id) per blank line, by the WHATWG rules."""
    out, last_id = [], None
    for record in model:
        event, data = None, None
        for f in record:
            if f.name in ("data", "bare-data", "spaced", "tight"):
                # `data:` + a value that starts with a space is `data: v`: that space is stripped.
                tight = f.value[1:] if f.value.startswith(" ") else f.value
                value = {"data": f.value, "bare-data": "", "spaced": " " + f.value, "tight": tight}[f.name]
                data = value if data is None else data + "\n" + value
            elif f.name == "event":
                event = f.value
            elif f.name == "id" and "\x00" not in f.value:
                last_id = f.value
        out.append((event, data, last_id))
    return out


def write(model: list[list[Field]], ends: list[bytes]) -> list[bytes]:
    """Each event's bytes, its lines ended by `ends` in turn. A blank line may not end in LF right
    after a line ended by a lone CR: the two would read as one CRLF."""
    raws, previous, drawn = [], b"", iter(ends)
    for record in model:
        raw = bytearray()
        for line in [*(f.line() for f in record), b""]:
            end = next(drawn)
            if not line and previous == b"\r" and end == b"\n":
                end = b"\r\n"
            raw += line + end
            previous = end
        raws.append(bytes(raw))
    return raws


def lines_in(model: list[list[Field]]) -> int:
    return sum(len(record) + 1 for record in model)


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """`data` cut at random places (single bytes and empty chunks included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=20)))
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


def split(chunks: list[bytes], limit: int = 1 << 20) -> list[SseEvent]:
    """The events of a whole stream (a CR that ends it is held until close() says no LF comes)."""
    splitter = SseSplitter(limit)
    out: list[SseEvent] = []
    for chunk in chunks:
        out += splitter.feed(chunk)
    rest = splitter.close()
    return settled(out if rest is None else [*out, rest])


def fields_of(events: list[SseEvent]) -> list[tuple[str | None, str | None, str | None]]:
    return [(e.event, e.data, e.id) for e in events]


@SETTINGS
@given(model=models, data=st.data(), bom=st.booleans())
@example(model=[[Field("data", "a")], [Field("data", "c")]], data=None, bom=False).via("CR | empty chunk | LF")
def test_any_chunking_gives_the_events_of_the_model(
    model: list[list[Field]], data: st.DataObject | None, bom: bool
) -> None:
    if data is None:
        raws = [b"data: a\r\r\n", b"data: c\n\n"]
        chunks = [b"data: a\r", b"", b"\r", b"", b"\ndata: c\n\n"]
    else:
        raws = write(model, data.draw(st.lists(line_ends, min_size=lines_in(model), max_size=lines_in(model))))
        if bom:
            raws[0] = BOM + raws[0]
        chunks = data.draw(chunkings(b"".join(raws)), label="chunks")
    events = split(chunks)  # settled: raws regrouped
    assert events == split([b"".join(raws)])
    assert fields_of(events) == expected(model)
    assert [e.raw for e in events] == raws  # raw bytes per event: a recording replays identically


def settled(events: list[SseEvent]) -> list[SseEvent]:
    """The events with the LF that completes an event's CRLF (cut between two chunks) moved back
    into that event; an "event" of that LF alone (close() right after it) goes."""
    out: list[SseEvent] = []
    for event in events:
        raw = event.raw
        if out:
            previous, raw = regroup(out[-1].raw, raw)
            out[-1] = replace(out[-1], raw=previous)
        if raw:
            out.append(replace(event, raw=raw))
    return out


@SETTINGS
@given(model=models, data=st.data())
def test_line_end_variants_are_equivalent(model: list[list[Field]], data: st.DataObject) -> None:
    n = lines_in(model)
    mixed = data.draw(st.lists(line_ends, min_size=n, max_size=n), label="ends")
    for ends in ([b"\n"] * n, [b"\r\n"] * n, [b"\r"] * n, mixed):
        stream = b"".join(write(model, ends))
        assert fields_of(split([stream])) == expected(model), ends


@SETTINGS
@given(model=models, data=st.data(), limit=st.integers(1, 80), tail=st.binary(max_size=60))
def test_the_bound_on_a_pending_event(model: list[list[Field]], data: st.DataObject, limit: int, tail: bytes) -> None:
    """An event may hold `limit` bytes before its blank line (lines with their ends; the blank
    line not counted); an unfinished tail likewise. Past it: SseLimitError, whatever the chunking."""
    n = lines_in(model)
    raws = write(model, data.draw(st.lists(line_ends, min_size=n, max_size=n), label="ends"))
    tail = tail.replace(b"\r", b"").replace(b"\n", b"")  # one unfinished line
    too_big = len(tail) > limit or any(len(_without_blank_line(raw)) > limit for raw in raws)
    stream = b"".join(raws) + tail
    for chunks in ([stream], data.draw(chunkings(stream), label="chunks")):
        if too_big:
            with pytest.raises(SseLimitError):
                split(chunks, limit)
        else:  # the tail, if any, is the unfinished event close() hands over
            assert fields_of(split(chunks, limit))[: len(model)] == expected(model)


def _without_blank_line(raw: bytes) -> bytes:
    """An event's bytes without the line end of its blank line."""
    for end in (b"\r\n", b"\r", b"\n"):
        if raw.endswith(end) and (len(raw) == len(end) or raw[: -len(end)][-1:] in (b"\r", b"\n")):
            return raw[: -len(end)]
    raise AssertionError(raw)


@SETTINGS
@given(
    stream=st.binary(max_size=400)
    | st.lists(st.sampled_from([b"\r", b"\n", b"data:", b"id: 1", b":c", b" ", b"x", BOM, b"\xef"])).map(b"".join),
    data=st.data(),
)
def test_random_bytes_split_alike_in_any_chunking(stream: bytes, data: st.DataObject) -> None:
    def run(chunks: list[bytes]) -> list[SseEvent] | None:
        try:
            return split(chunks, 64)
        except SseLimitError:
            return None

    whole = run([stream])
    assert run(data.draw(chunkings(stream), label="chunks")) == whole
    if whole is not None:
        assert b"".join(e.raw for e in whole) == stream  # nothing lost, nothing invented


def test_bom_only_at_the_start_and_cut_anywhere() -> None:
    stream = BOM + b"data: a\n\n" + BOM + b"data: b\n\n"
    for cut in range(len(stream) + 1):
        events = split([stream[:cut], stream[cut:]])
        # the second BOM is content: a field named "\ufeffdata", ignored
        assert fields_of(events) == [(None, "a", None), (None, None, None)], cut
        assert b"".join(e.raw for e in events) == stream
    splitter = SseSplitter()
    assert splitter.feed(b"\xef\xbb") == []
    closed = splitter.close()
    assert closed is not None and closed.raw == b"\xef\xbb" and closed.data is None


def test_close_returns_the_unfinished_event() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b"id: 7\nevent: x\ndata: 1\ndata: 2") == []
    rest = splitter.close()
    assert rest == SseEvent("x", "1\n2", "7", b"id: 7\nevent: x\ndata: 1\ndata: 2")
    assert splitter.close() is None
    cut = SseSplitter()  # a CR at the end of a chunk ends its line at once
    assert cut.feed(b"data: 1\n\r") == [SseEvent(None, "1", None, b"data: 1\n\r")]
    assert cut.feed(b"\ndata: 2\r") == []  # its LF is skipped, not a blank line
    assert cut.feed(b"\n\r\n") == [SseEvent(None, "2", None, b"\ndata: 2\r\n\r\n")]
    assert SseSplitter().close() is None


def test_fields_ids_and_limits() -> None:
    events = split([b": hi\nid: 1\ndata\n\nid: a\x00b\nretry: 5\ndata: x\n\nid\ndata: y\n\n"])
    assert fields_of(events) == [(None, "", "1"), (None, "x", "1"), (None, "y", "")]
    assert split([b"event: e\n\n"])[0] == SseEvent("e", None, None, b"event: e\n\n")
    with pytest.raises(SseLimitError):
        split([b"data: " + b"a" * 10], limit=8)  # an unfinished line counts
    with pytest.raises(SseLimitError):
        split([b"data: 1\n", b"data: 2\n"], limit=12)  # so do finished lines of one event
    assert len(split([b"data: 1\n\n"] * 50, limit=8)) == 50  # events that end free their bytes
    with pytest.raises(ValueError):
        SseSplitter(0)
