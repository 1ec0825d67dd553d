"""Stream recording and replay: byte-identical round trips for OpenAI and Anthropic streams
(shapes from provider-apis.md §3.2 and §2.4), and every way a stream must not be stored."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from continuum_ingress.cache.errors import EntryFormatError
from continuum_ingress.cache.protocol.entry import (
    CachedResponse,
    EntryKind,
    decode_entry,
    encode_entry,
    keep_headers,
)
from continuum_ingress.cache.protocol.sse import SseDialect, StreamRecorder

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "X-Request-Id": "req-1", "Date": "now"}


def _openai_chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-x",
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if delta or finish else [],
        "usage": usage,
    }
    return orjson.dumps(doc)


def openai_stream(pieces: list[str], *, include_usage: bool = True, newline: bytes = b"\n") -> bytes:
    """A Chat Completions SSE stream: role chunk, content chunks, finish chunk, usage chunk, [DONE]."""
    frames = [_openai_chunk({"role": "assistant", "content": ""})]
    frames += [_openai_chunk({"content": p}) for p in pieces]
    frames.append(_openai_chunk({}, finish="stop"))
    if include_usage:
        usage = {
            "prompt_tokens": 2000,
            "completion_tokens": len(pieces),
            "total_tokens": 2000 + len(pieces),
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }
        frames.append(_openai_chunk({}, usage=usage))
    frames.append(b"[DONE]")
    return b"".join(b"data: " + f + newline + newline for f in frames)


def anthropic_stream(pieces: list[str], *, newline: bytes = b"\n") -> bytes:
    """A Messages SSE stream with event: lines, a ping, cumulative usage in message_delta."""
    usage = {"input_tokens": 330, "cache_creation_input_tokens": 6702, "cache_read_input_tokens": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-x",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        ("ping", {"type": "ping"}),
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})
        for p in pieces
    ]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {**usage, "output_tokens": len(pieces)},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(
        b"event: " + name.encode() + newline + b"data: " + orjson.dumps(data) + newline + newline
        for name, data in events
    )


def responses_stream(pieces: list[str], newline: bytes = b"\n", final: str = "response.completed") -> bytes:
    """An OpenAI Responses stream: typed events, no [DONE]; `final` ends it."""
    text = "".join(pieces)
    events: list[tuple[str, dict[str, object]]] = [
        ("response.created", {"response": {"id": "resp_1", "status": "in_progress"}}),
        ("response.output_item.added", {"output_index": 0, "item": {"type": "message", "id": "msg_1"}}),
    ]
    events += [("response.output_text.delta", {"item_id": "msg_1", "delta": p}) for p in pieces]
    events += [
        ("response.output_text.done", {"item_id": "msg_1", "text": text}),
        (final, {"response": {"id": "resp_1", "status": final.split(".")[1], "usage": {"input_tokens": 40}}}),
    ]
    return b"".join(
        b"event: " + name.encode() + newline + b"data: " + orjson.dumps({"type": name, "sequence_number": i, **data})
        + newline + newline
        for i, (name, data) in enumerate(events)
    )  # fmt: skip


def random_chunks(data: bytes, rng: random.Random, max_len: int = 40) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, max_len)
        out.append(data[i : i + n])
        i += n
    return out


def record(dialect: SseDialect, chunks: list[bytes], max_bytes: int = 1 << 20) -> StreamRecorder:
    rec = StreamRecorder(dialect, max_bytes, status=200, headers=SSE_HEADERS)
    for chunk in chunks:
        rec.feed(chunk)
    return rec


PIECES = ["Hel", "lo", ", wor", "ld — ünïcødé ✓", "!"]
CASES = [
    (SseDialect.OPENAI, openai_stream(PIECES)),
    (SseDialect.OPENAI, openai_stream(PIECES, newline=b"\r\n")),
    (SseDialect.OPENAI, openai_stream(PIECES, include_usage=False, newline=b"\r")),
    (SseDialect.ANTHROPIC, anthropic_stream(PIECES)),
    (SseDialect.ANTHROPIC, anthropic_stream(PIECES, newline=b"\r\n")),
    (SseDialect.RESPONSES, responses_stream(PIECES)),
    (SseDialect.RESPONSES, responses_stream(PIECES, newline=b"\r\n", final="response.incomplete")),
]

TERMINAL = {
    SseDialect.OPENAI: b"data: [DONE]",
    SseDialect.ANTHROPIC: b"event: message_stop",
    SseDialect.RESPONSES: b"event: response.",
}


@pytest.mark.parametrize(("dialect", "stream"), CASES)
def test_round_trip_is_byte_identical_for_any_chunking(dialect: SseDialect, stream: bytes) -> None:
    rng = random.Random(5)
    for split in ([stream], [bytes([b]) for b in stream], *(random_chunks(stream, rng) for _ in range(30))):
        rec = record(dialect, split)
        # A stream whose last byte is a lone CR completes only at end of body (an LF may follow).
        assert rec.complete or stream.endswith(b"\r")
        entry = rec.finish()
        assert entry is not None and entry.kind is EntryKind.STREAM
        replayed = decode_entry(encode_entry(entry))
        assert b"".join(replayed.chunks()) == stream
        assert replayed.content_type == "text/event-stream; charset=utf-8"
        assert replayed.headers == (("content-type", "text/event-stream; charset=utf-8"),)


def test_replay_yields_one_chunk_per_event_with_usage() -> None:
    stream = openai_stream(PIECES)
    entry = record(SseDialect.OPENAI, random_chunks(stream, random.Random(1))).finish()
    assert entry is not None
    events = list(entry.chunks())
    assert len(events) == len(PIECES) + 4  # role, pieces, finish, usage, [DONE]
    assert events[-1] == b"data: [DONE]\n\n"
    usage = orjson.loads(events[-2][len(b"data: ") :])["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 1920
    content = "".join(orjson.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert content == "".join(PIECES)


def test_anthropic_events_keep_their_event_lines() -> None:
    entry = record(SseDialect.ANTHROPIC, [anthropic_stream(["OK"])]).finish()
    assert entry is not None
    names = [e.split(b"\n", 1)[0] for e in entry.chunks()]
    assert names[0] == b"event: message_start" and names[2] == b"event: ping" and names[-1] == b"event: message_stop"


@pytest.mark.parametrize(("dialect", "stream"), CASES)
def test_interrupted_stream_is_not_stored(dialect: SseDialect, stream: bytes) -> None:
    terminal = stream.rindex(TERMINAL[dialect])
    for cut in (1, len(stream) // 2, terminal, terminal + 8):
        rec = record(dialect, [stream[:cut]])
        assert not rec.complete
        assert rec.finish() is None
        assert rec.failure == "no terminal event"


def test_abort_after_terminal_discards() -> None:
    rec = record(SseDialect.OPENAI, [openai_stream(PIECES)])
    assert rec.complete
    rec.abort("client disconnected")
    assert rec.finish() is None and rec.failure == "client disconnected"


@pytest.mark.parametrize(("dialect", "stream"), CASES)
def test_oversized_stream_is_not_stored_and_drops_its_copy(dialect: SseDialect, stream: bytes) -> None:
    rec = record(dialect, random_chunks(stream, random.Random(3)), max_bytes=len(stream) - 1)
    assert rec.failure == "oversized" and rec.finish() is None
    exact = record(dialect, random_chunks(stream, random.Random(3)), max_bytes=len(stream))
    assert exact.finish() is not None


def test_openai_error_chunk_is_not_stored() -> None:
    good = openai_stream(["a"])
    error = b'data: {"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}\n\n'
    stream = good.replace(b"data: [DONE]", error + b"data: [DONE]")
    rec = record(SseDialect.OPENAI, random_chunks(stream, random.Random(2)))
    assert rec.failure == "error event" and rec.finish() is None


def test_openai_content_mentioning_error_is_fine() -> None:
    stream = openai_stream(['the "error" word', "error"])
    assert record(SseDialect.OPENAI, [stream]).finish() is not None


def test_anthropic_error_event_is_not_stored() -> None:
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    stream = anthropic_stream(["a"])
    cut = stream.index(b"event: content_block_stop")
    rec = record(SseDialect.ANTHROPIC, [stream[:cut] + error])
    assert rec.failure == "error event" and rec.finish() is None


@pytest.mark.parametrize("event", [b"error", b"response.failed"])
def test_responses_error_or_failure_event_is_not_stored(event: bytes) -> None:
    stream = responses_stream(["a"])
    cut = stream.index(b"event: response.output_text.done")
    failed = b"event: " + event + b'\ndata: {"type":"' + event + b'","sequence_number":9}\n\n'
    rec = record(SseDialect.RESPONSES, [stream[:cut] + failed])
    assert rec.failure == "error event" and rec.finish() is None


def test_data_after_terminal_event_is_not_stored_but_blank_lines_are_kept() -> None:
    stream = openai_stream(["a"])
    assert record(SseDialect.OPENAI, [stream + b'data: {"late":1}\n\n']).finish() is None
    entry = record(SseDialect.OPENAI, [stream + b"\n\n"]).finish()
    assert entry is not None and b"".join(entry.chunks()) == stream + b"\n\n"


def test_final_event_without_blank_line_ends_at_end_of_body() -> None:
    stream = openai_stream(["a"])[:-1]  # "data: [DONE]\n"
    entry = record(SseDialect.OPENAI, [stream]).finish()
    assert entry is not None and b"".join(entry.chunks()) == stream


def test_comments_are_kept_and_ignored() -> None:
    stream = b": keep-alive\n\n" + openai_stream(["x"])
    entry = record(SseDialect.OPENAI, random_chunks(stream, random.Random(9), 3)).finish()
    assert entry is not None and b"".join(entry.chunks()) == stream


def test_recorder_does_not_touch_the_chunks_it_is_fed() -> None:
    stream = openai_stream(PIECES)
    chunks = random_chunks(stream, random.Random(4))
    copies = [bytes(c) for c in chunks]
    record(SseDialect.OPENAI, chunks)
    assert chunks == copies


def test_whole_response_entry_round_trip_keeps_only_content_type() -> None:
    body = orjson.dumps({"id": "chatcmpl-1", "choices": [{"message": {"content": "Hi"}}]})
    entry = CachedResponse(
        EntryKind.RESPONSE, 200, keep_headers({"Content-Type": "application/json", "Set-Cookie": "x"}), body=body
    )
    back = decode_entry(encode_entry(entry))
    assert back == entry and back.headers == (("content-type", "application/json"),)
    assert list(back.chunks()) == [body] and not back.is_stream


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"not msgpack at all \xff\xfe",
        orjson.dumps({"v": 1}),
        bytes([0x81, 0xA1, 0x76, 0x02]),  # {"v": 2}: another version
    ],
)
def test_foreign_or_other_version_entries_are_rejected(blob: bytes) -> None:
    with pytest.raises(EntryFormatError):
        decode_entry(blob)


def test_entry_fields_are_type_checked() -> None:
    import msgpack

    bad = msgpack.packb({"v": 1, "k": "s", "s": 200, "h": [], "e": ["text, not bytes"]}, use_bin_type=True)
    with pytest.raises(EntryFormatError):
        decode_entry(bad)
    bad_kind = msgpack.packb({"v": 1, "k": "x", "s": 200, "h": [], "b": b""}, use_bin_type=True)
    with pytest.raises(EntryFormatError):
        decode_entry(bad_kind)
