"""The answer a chat request got (an OpenAI chat completion or an Anthropic Messages response),
read from the bytes the client received (kv/answers.py), and the chunk chain of a conversation
followed by its answer (kv/chunks.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from continuum_common.hashing.request_text import content_text
from continuum_common.hashing.responses_input import responses_messages
from continuum_ingress.kv.answers import AnswerReader, AnswerRecorder, reads_answers
from continuum_ingress.kv.chunks import answered_chain, chunk_chain, conversation_bytes
from continuum_ingress.protocol.apis import Api


def sse(*chunks: dict[str, Any] | str) -> bytes:
    out = b""
    for chunk in chunks:
        data = chunk if isinstance(chunk, str) else orjson.dumps(chunk).decode()
        out += f"data: {data}\n\n".encode()
    return out


def delta(content: str | None = None, index: int = 0, **extra: Any) -> dict[str, Any]:
    part: dict[str, Any] = {"content": content} if content is not None else {}
    part.update(extra)
    return {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": index, "delta": part}]}


def streamed(body: bytes, step: int = 0) -> str | None:
    reader = AnswerReader(stream=True)
    if step:
        for i in range(0, len(body), step):
            reader.feed(body[i : i + step])
    else:
        reader.feed(body)
    return reader.text()


STREAM = sse(
    delta(role="assistant"),
    delta("Revenue "),
    delta("grew by 12%.\\n"),
    {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"id": "c", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}},
    "[DONE]",
)


@pytest.mark.parametrize("step", [0, 1, 7, 64])
def test_a_stream_gives_its_text_however_it_is_cut(step: int) -> None:
    assert streamed(STREAM, step) == "Revenue grew by 12%.\\n"


def test_crlf_line_ends_a_byte_order_mark_other_fields_and_an_empty_answer() -> None:
    body = STREAM.replace(b"\n", b"\r\n")
    assert streamed(body) == "Revenue grew by 12%.\\n"
    assert streamed(b"\xef\xbb\xbf" + STREAM, 3) == "Revenue grew by 12%.\\n"
    fields = b": keep-alive\n\nevent: message\nid: 7\n" + STREAM.replace(b"data: ", b"data:", 2)
    assert streamed(fields, 5) == "Revenue grew by 12%.\\n"
    assert streamed(sse(delta(role="assistant"), "[DONE]")) == ""


@pytest.mark.parametrize(
    "body",
    [
        sse(delta("Revenue ")),  # no [DONE]: cut short
        sse(delta("a"), delta("b", index=1), "[DONE]"),  # a second choice
        sse(delta("a"), delta(tool_calls=[{"index": 0, "function": {"name": "f"}}]), "[DONE]"),
        sse(delta(function_call={"name": "f"}), "[DONE]"),
        sse(delta("a"), {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}, "[DONE]"),
        sse(delta("a"), {"error": {"message": "engine died"}}, "[DONE]"),
        sse(delta("a"), "{not json", "[DONE]"),
        sse(delta("a"), {"choices": "nope"}, "[DONE]"),
        sse({"choices": [{"index": 0, "delta": {"content": 3}}]}, "[DONE]"),
        # one event's JSON over two data lines (legal SSE, never sent by OpenAI-style servers)
        b'data: {"choices": [{"index": 0,\ndata: "delta": {"content": "a"}}]}\n\n' + sse("[DONE]"),
    ],
)
def test_a_stream_that_cannot_be_replayed_as_a_plain_message_gives_nothing(body: bytes) -> None:
    assert streamed(body) is None


def test_an_answer_larger_than_the_bound_is_dropped_and_not_kept() -> None:
    reader = AnswerReader(stream=True, max_bytes=100)
    reader.feed(sse(delta("x" * 60)))
    reader.feed(sse(delta("y" * 60), "[DONE]"))
    assert reader.text() is None
    one_event = AnswerReader(stream=True, max_bytes=100)
    one_event.feed(sse(delta("x" * 200), "[DONE]"))
    assert one_event.text() is None
    whole = AnswerReader(stream=False, max_bytes=100)
    whole.feed(b"{" + b" " * 200)
    assert whole.text() is None


def completion(*choices: dict[str, Any]) -> bytes:
    return orjson.dumps({"id": "c", "object": "chat.completion", "choices": list(choices)})


def whole(body: bytes) -> str | None:
    reader = AnswerReader(stream=False)
    reader.feed(body[:10])
    reader.feed(body[10:])
    return reader.text()


def test_a_whole_body_gives_its_message() -> None:
    message: dict[str, Any] = {"role": "assistant", "content": "Lower.", "refusal": None, "tool_calls": []}
    assert whole(completion({"index": 0, "message": message, "finish_reason": "stop"})) == "Lower."
    assert whole(completion({"index": 0, "message": {"role": "assistant", "content": None}})) == ""


@pytest.mark.parametrize(
    "body",
    [
        completion(
            {"index": 0, "message": {"role": "assistant", "content": "a"}},
            {"index": 1, "message": {"role": "assistant", "content": "b"}},
        ),
        completion({"index": 0, "message": {"role": "assistant", "tool_calls": [{"id": "t"}]}}),
        completion({"index": 0, "message": {"role": "assistant", "content": [{"type": "text"}]}}),
        b'{"error": {"message": "bad"}}',
        b"[1, 2]",
        b"not json",
    ],
)
def test_a_whole_body_that_cannot_be_replayed_gives_nothing(body: bytes) -> None:
    assert whole(body) is None


def recorder(stream: bool) -> tuple[AnswerRecorder, list[str | None]]:
    settled: list[str | None] = []
    return AnswerRecorder(stream=stream, on_answer=settled.append), settled


async def test_a_recorder_settles_once_with_the_answer_the_client_got() -> None:
    follow, settled = recorder(stream=True)
    follow.feed(STREAM)
    await follow.commit(200, [])
    follow.settle(None)  # the request ended
    follow.abort()
    follow.feed(STREAM)  # a retry's forwarder feeding it again changes nothing
    await follow.commit(200, [])
    assert settled == ["Revenue grew by 12%.\\n"]


async def test_a_stream_closed_by_the_client_after_done_is_still_a_whole_answer() -> None:
    follow, settled = recorder(stream=True)
    follow.feed(STREAM)
    follow.abandon(200, [])  # the client closed on [DONE]; the request ends cancelled
    assert settled == ["Revenue grew by 12%.\\n"]
    cut, cut_settled = recorder(stream=True)
    cut.feed(STREAM[:40])
    cut.abandon(200, [])
    cut.settle(None)
    assert cut_settled == [None]
    refused, refused_settled = recorder(stream=True)
    refused.feed(STREAM)
    refused.abandon(429, [])  # a whole stream under an error status is no answer
    assert refused_settled == [None]
    broken, broken_settled = recorder(stream=True)
    broken.feed(STREAM)
    broken.abort()  # the upstream broke after [DONE]: the client still got it all
    assert broken_settled == ["Revenue grew by 12%.\\n"]


async def test_a_failed_or_unfed_answer_settles_empty_when_the_request_ends() -> None:
    failed, settled = recorder(stream=False)
    failed.feed(b'{"error": {"message": "nope"}}')
    await failed.commit(400, [])
    assert settled == [None]
    unfed, unfed_settled = recorder(stream=False)
    unfed.settle(None)
    assert unfed_settled == [None]
    whole, whole_settled = recorder(stream=False)
    whole.feed(completion({"index": 0, "message": {"role": "assistant", "content": "Lower."}}))
    whole.abort()  # a whole body the forwarder gave up on: not replayed
    assert whole_settled == [None]
    committed, committed_settled = recorder(stream=False)
    committed.feed(completion({"index": 0, "message": {"role": "assistant", "content": "Lower."}}))
    await committed.commit(200, [])
    assert committed_settled == ["Lower."]


ANSWER = "A table of quarterly revenue, by region, with notes. " * 4
BODY: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You answer questions about the report. " * 20},
        {"role": "user", "content": "What is on page one?"},
    ],
}


def test_the_answered_chain_extends_the_request_and_starts_the_next_turn() -> None:
    own = chunk_chain(conversation_bytes(Api.CHAT, BODY), 32)
    answered = answered_chain(BODY, ANSWER, 32)
    assert answered[: len(own)] == own and len(answered) > len(own)
    next_turn = {
        **BODY,
        "messages": [*BODY["messages"], {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "Why?"}],
    }
    assert chunk_chain(conversation_bytes(Api.CHAT, next_turn), 32)[: len(answered)] == answered
    assert BODY["messages"][-1]["role"] == "user"  # the request's body is left as it was


# -- Anthropic Messages ------------------------------------------------------------------------


def events(*items: dict[str, Any]) -> bytes:
    """An Anthropic Messages stream: `event:` and `data:` lines per event."""
    return b"".join(f"event: {e['type']}\ndata: {orjson.dumps(e).decode()}\n\n".encode() for e in items)


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}} for p in pieces),
        {"type": "content_block_stop", "index": index},
    ]


START = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}
END = [{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
       {"type": "message_stop"}]  # fmt: skip
MESSAGES_STREAM = events(START, {"type": "ping"}, *text_block(0, "Revenue ", "grew by 12%."), *END)


def anthropic_streamed(body: bytes, step: int = 0) -> str | None:
    reader = AnswerReader(stream=True, api=Api.MESSAGES)
    for i in range(0, len(body), step or len(body)):
        reader.feed(body[i : i + (step or len(body))])
    return reader.text()


@pytest.mark.parametrize("step", [0, 1, 9, 100])
def test_an_anthropic_stream_gives_its_text_however_it_is_cut(step: int) -> None:
    assert anthropic_streamed(MESSAGES_STREAM, step) == "Revenue grew by 12%."
    assert anthropic_streamed(MESSAGES_STREAM.replace(b"\n", b"\r\n"), step) == "Revenue grew by 12%."


def test_anthropic_text_blocks_are_joined_as_a_replayed_content_array_is_read() -> None:
    body = events(START, *text_block(0, "First."), *text_block(1, "Second."), *END)
    text = anthropic_streamed(body, 5)
    replayed = [{"type": "text", "text": "First."}, {"type": "text", "text": "Second."}]
    assert text == content_text(replayed) == "First.\nSecond."


TOOL_USE = [
    {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
]  # fmt: skip
THINKING = {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}


@pytest.mark.parametrize(
    "body",
    [
        events(START, *text_block(0, "Let me look."), *TOOL_USE, *END),  # a tool call
        events(
            START,
            *text_block(0, "Hi"),
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
            {"type": "message_stop"},
        ),
        events(START, THINKING, *text_block(1, "Hi"), *END),  # a thinking block is not replayed as text
        events(START, *text_block(0, "Hi"), {"type": "error", "error": {"type": "overloaded_error"}}),
        events(START, *text_block(0, "Hi")),  # no message_stop: cut short
        events(START, *text_block(0, "Hi"), {"type": "something_new"}, *END),
        MESSAGES_STREAM.replace(b"grew", b'"grew'),  # broken JSON
    ],
)
def test_an_anthropic_stream_that_cannot_be_replayed_as_plain_text_gives_nothing(body: bytes) -> None:
    assert anthropic_streamed(body, 11) is None


def test_an_openai_done_line_does_not_end_an_anthropic_stream() -> None:
    assert anthropic_streamed(events(START, *text_block(0, "Hi")) + b"data: [DONE]\n\n") is None


def whole_message(*content: dict[str, Any], stop: str = "end_turn") -> bytes:
    doc = {"id": "msg_1", "type": "message", "role": "assistant", "content": list(content), "stop_reason": stop}
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (whole_message({"type": "text", "text": "Revenue grew."}), "Revenue grew."),
        (whole_message({"type": "text", "text": "A."}, {"type": "text", "text": "B."}), "A.\nB."),
        (
            whole_message(
                {"type": "text", "text": "Hi"},
                {"type": "tool_use", "id": "t", "name": "f", "input": {}},
                stop="tool_use",
            ),
            None,
        ),
        (whole_message({"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Hi"}), None),
        (orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}), None),
        (b"{not json", None),
    ],
)
def test_a_whole_anthropic_response_gives_its_text(body: bytes, expected: str | None) -> None:
    reader = AnswerReader(stream=False, api=Api.MESSAGES)
    for i in range(0, len(body), 13):
        reader.feed(body[i : i + 13])
    assert reader.text() == expected


def test_answers_are_read_for_chat_requests_keyed_as_they_were_sent() -> None:
    assert reads_answers(Api.CHAT, Api.CHAT) and reads_answers(Api.MESSAGES, Api.MESSAGES)
    assert reads_answers(Api.RESPONSES, Api.CHAT)  # a Responses request resending its conversation
    assert not reads_answers(Api.RESPONSES, Api.RESPONSES)  # one continuing a stored response
    assert not reads_answers(Api.COMPLETIONS, Api.COMPLETIONS)


def test_the_answered_chain_of_an_anthropic_request_starts_its_next_turn() -> None:
    body = {"model": "m", "system": "You answer questions about the report. " * 20,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is on page one?"}]}]}  # fmt: skip
    answered = answered_chain(body, ANSWER, 32)
    replayed = {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]}
    next_turn = {**body, "messages": [*body["messages"], replayed, {"role": "user", "content": "Why?"}]}
    assert chunk_chain(conversation_bytes(Api.MESSAGES, next_turn), 32)[: len(answered)] == answered
    assert len(answered) > len(chunk_chain(conversation_bytes(Api.MESSAGES, body), 32))


# -- OpenAI Responses --------------------------------------------------------------------------


def message_item(*texts: str, part: str = "output_text") -> dict[str, Any]:
    content = [{"type": part, "text": t, "annotations": []} for t in texts]
    return {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": content}


REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"}


def response(*output: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": list(output), "error": None}


def responses_stream(final: dict[str, Any], *deltas: str, end: str = "response.completed") -> bytes:
    items: list[dict[str, Any]] = [{"type": "response.created", "response": {**final, "status": "in_progress"}}]
    items += [{"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": d} for d in deltas]
    items.append({"type": end, "response": final})
    return events(*items)


def test_an_incomplete_responses_stream_gives_the_text_it_has() -> None:
    final = response(message_item("Cut sh"), status="incomplete")
    assert responses_streamed(responses_stream(final, "Cut sh", end="response.incomplete"), 7) == "Cut sh"


def responses_streamed(body: bytes, step: int) -> str | None:
    reader = AnswerReader(stream=True, api=Api.RESPONSES)
    for i in range(0, len(body), step):
        reader.feed(body[i : i + step])
    return reader.text()


@pytest.mark.parametrize("step", [1, 13, 4096])
def test_a_responses_stream_gives_the_text_of_its_final_message(step: int) -> None:
    final = response(REASONING, message_item("Revenue grew", "by 12%."))
    # the deltas are not read (the final response carries the text); "error" in one is no error
    body = responses_stream(final, "Revenue grew", '"error"', "by 12%.")
    assert responses_streamed(body, step) == "Revenue grew\nby 12%."


@pytest.mark.parametrize(
    "body",
    [
        responses_stream(response(message_item("Hi"), CALL)),  # a function call
        responses_stream(response(message_item("A"), message_item("B"))),  # two messages
        responses_stream(response(message_item("no", part="refusal"))),
        responses_stream(response(status="failed"), end="response.failed"),
        events({"type": "error", "code": "server_error", "message": "boom"}),
        responses_stream(response(message_item("Hi")))[:-60],  # cut before its end
    ],
)
def test_a_responses_stream_that_cannot_be_replayed_as_one_message_gives_nothing(body: bytes) -> None:
    assert responses_streamed(body, 17) is None


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (response(REASONING, message_item("Revenue grew.")), "Revenue grew."),
        (response(message_item("Hi"), CALL), None),
        (response(message_item("Cut sh"), status="incomplete"), "Cut sh"),  # at max_output_tokens
        (response(message_item("Hi"), status="failed"), None),
        ({"error": {"message": "no"}}, None),
    ],
)
def test_a_whole_responses_answer_gives_its_text(doc: dict[str, Any], expected: str | None) -> None:
    reader = AnswerReader(stream=False, api=Api.RESPONSES)
    reader.feed(orjson.dumps(doc))
    assert reader.text() == expected


def test_a_replayed_responses_answer_is_read_as_the_message_learnt() -> None:
    final = response(REASONING, message_item("Revenue grew", "by 12%."))
    text = responses_streamed(responses_stream(final), 4096)
    replay = {"instructions": "Be brief.", "input": [{"role": "user", "content": "Q?"}, *final["output"]]}
    assert responses_messages(replay)[-1] == {"role": "assistant", "content": text}
