"""Request validation and error bodies: every bad input names its parameter."""

from __future__ import annotations

import orjson
import pytest

from continuum_ingress.errors import InvalidRequest, RequestError
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.errors import ErrorStyle, error_body, stream_error_event
from continuum_ingress.protocol.requests import conversation_start, parse_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _bad(api: Api, body: object) -> InvalidRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with pytest.raises(InvalidRequest) as info:
        parse_request(api, raw)
    return info.value


def test_valid_requests_parse() -> None:
    chat = parse_request(Api.CHAT, orjson.dumps({**CHAT, "stream": True, "user": "u1"}))
    assert (chat.model, chat.stream, chat.user) == ("m", True, "u1")
    msg = parse_request(
        Api.MESSAGES,
        orjson.dumps(
            {
                "model": "c",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "metadata": {"user_id": "s"},
            }
        ),
    )
    assert (msg.model, msg.stream, msg.user) == ("c", False, "s")
    emb = parse_request(
        Api.EMBEDDINGS, orjson.dumps({"model": "e", "input": [[1, 2], [3]], "encoding_format": "base64"})
    )
    assert emb.model == "e"
    comp = parse_request(Api.COMPLETIONS, orjson.dumps({"model": "m", "prompt": [1, 2, 3]}))
    assert comp.api is Api.COMPLETIONS
    resp = parse_request(Api.RESPONSES, orjson.dumps({"model": "m", "input": "hi"}))
    assert resp.api is Api.RESPONSES


@pytest.mark.parametrize(
    ("raw", "code"),
    [(b"", "invalid_json"), (b"{bad", "invalid_json"), (b"[1, 2]", "invalid_json"), (b'"text"', "invalid_json")],
)
def test_malformed_json(raw: bytes, code: str) -> None:
    assert _bad(Api.CHAT, raw).code == code


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": CHAT["messages"]}, "model"),
        ({**CHAT, "model": 7}, "model"),
        ({**CHAT, "model": ""}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": {"a": 1}, "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user"}, {"role": 5}]}, "messages[1].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": "m", "messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "temperature": 3}, "temperature"),
        ({**CHAT, "temperature": True}, "temperature"),
        ({**CHAT, "max_tokens": 1.5}, "max_tokens"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "stop": [1]}, "stop[0]"),
        ({**CHAT, "tools": [1]}, "tools[0]"),
        ({**CHAT, "user": 3}, "user"),
        ({**CHAT, "cache_salt": 3}, "cache_salt"),
        ({**CHAT, "top_logprobs": 21}, "top_logprobs"),
        ({**CHAT, "response_format": "json"}, "response_format"),
        ({**CHAT, "tool_choice": 3}, "tool_choice"),
        ({**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ],
)
def test_chat_rejects_with_param(body: dict[str, object], param: str) -> None:
    assert _bad(Api.CHAT, body).param == param


@pytest.mark.parametrize(
    ("api", "body", "param"),
    [
        (Api.COMPLETIONS, {"model": "m"}, "prompt"),
        (Api.COMPLETIONS, {"model": "m", "prompt": [1, "a"]}, "prompt[1]"),
        (Api.COMPLETIONS, {"model": "m", "prompt": "a", "best_of": 0}, "best_of"),
        (Api.COMPLETIONS, {"model": "m", "prompt": "a", "echo": "no"}, "echo"),
        (Api.COMPLETIONS, {"model": "m", "prompt": "a", "max_tokens": -1}, "max_tokens"),
        (Api.COMPLETIONS, {"model": "m", "prompt": "a", "temperature": 9}, "temperature"),
        (Api.EMBEDDINGS, {"model": "m"}, "input"),
        (Api.EMBEDDINGS, {"model": "m", "input": []}, "input"),
        (Api.EMBEDDINGS, {"model": "m", "input": "x", "encoding_format": "hex"}, "encoding_format"),
        (Api.EMBEDDINGS, {"model": "m", "input": "x", "stream": True}, "stream"),
        (Api.RESPONSES, {"model": "m", "input": 4}, "input"),
        (Api.MESSAGES, {"model": "c", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (Api.MESSAGES, {"model": "c", "max_tokens": "5", "messages": []}, "max_tokens"),
        (Api.MESSAGES, {"model": "c", "max_tokens": 5}, "messages"),
        (
            Api.MESSAGES,
            {"model": "c", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            "messages.0.role",
        ),
        (Api.MESSAGES, {"model": "c", "max_tokens": 5, "messages": [{"role": "user"}]}, "messages.0.content"),
        (
            Api.MESSAGES,
            {"model": "c", "max_tokens": 5, "messages": [{"role": ["user"], "content": "x"}]},
            "messages.0.role",
        ),
        (
            Api.MESSAGES,
            {
                "model": "c",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "system": [{"type": "image"}],
            },
            "system.0.type",
        ),
        (
            Api.MESSAGES,
            {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5},
            "temperature",
        ),
    ],
)
def test_other_apis_reject_with_param(api: Api, body: dict[str, object], param: str) -> None:
    assert _bad(api, body).param == param


@pytest.mark.parametrize(
    ("api", "body", "param"),
    [
        (Api.CHAT, {**CHAT, "n": 1000}, "n"),
        (Api.CHAT, {**CHAT, "max_tokens": 1 << 40}, "max_tokens"),
        (Api.CHAT, {**CHAT, "max_completion_tokens": (1 << 24) + 1}, "max_completion_tokens"),
        (Api.CHAT, {**CHAT, "top_logprobs": 21}, "top_logprobs"),
        (Api.COMPLETIONS, {"model": "m", "prompt": [1, -1, 3]}, "prompt[1]"),
        (Api.COMPLETIONS, {"model": "m", "prompt": [[1, 2], [3, 1 << 31]]}, "prompt[1][1]"),
        (Api.COMPLETIONS, {"model": "m", "prompt": "x", "best_of": 129}, "best_of"),
        (Api.EMBEDDINGS, {"model": "m", "input": [-5]}, "input[0]"),
        (Api.RESPONSES, {"model": "m", "input": "x", "max_output_tokens": 1 << 25}, "max_output_tokens"),
        (
            Api.MESSAGES,
            {"model": "c", "max_tokens": 1 << 25, "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
        ),
    ],
)
def test_sanity_bounds(api: Api, body: dict[str, object], param: str) -> None:
    error = _bad(api, body)
    assert (error.param, error.code, error.status) == (param, "invalid_value", 400)


def test_values_at_the_sanity_bounds_pass() -> None:
    parse_request(Api.CHAT, orjson.dumps({**CHAT, "n": 128, "max_tokens": 1 << 24, "top_logprobs": 20}))
    parse_request(Api.COMPLETIONS, orjson.dumps({"model": "m", "prompt": [0, (1 << 31) - 1]}))


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_json_nested_past_the_depth_bound_is_refused() -> None:
    # The body object is level 1: 127 arrays inside it make 128 levels, the most allowed.
    parse_request(Api.CHAT, orjson.dumps({**CHAT, "extra": _nested(127)}))
    error = _bad(Api.CHAT, {**CHAT, "extra": _nested(128)})
    assert (error.code, error.status) == ("invalid_json", 400) and "128 levels" in error.message
    # Deeper than orjson writes (255) and than Python recurses: still a clean 400.
    deep = b'{"model":"m","x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    with pytest.raises(InvalidRequest):
        parse_request(Api.CHAT, deep)


def test_unknown_fields_pass_through() -> None:
    parsed = parse_request(Api.CHAT, orjson.dumps({**CHAT, "top_k": 5, "guided_json": {"x": 1}}))
    assert parsed.body["guided_json"] == {"x": 1}


def test_error_bodies_have_the_provider_shapes() -> None:
    error = InvalidRequest("bad thing", param="messages[0].role", code="invalid_value")
    openai = orjson.loads(error_body(ErrorStyle.OPENAI, error, "rid"))
    assert openai == {
        "error": {
            "message": "bad thing",
            "type": "invalid_request_error",
            "param": "messages[0].role",
            "code": "invalid_value",
        }
    }
    anthropic = orjson.loads(error_body(ErrorStyle.ANTHROPIC, error, "rid"))
    assert anthropic == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages[0].role: bad thing"},
        "request_id": "rid",
    }
    too_big = RequestError(413, "big", kind="too_large")
    assert orjson.loads(error_body(ErrorStyle.ANTHROPIC, too_big, "r"))["error"]["type"] == "request_too_large"
    unavailable = RequestError(503, "none", kind="unavailable")
    assert orjson.loads(error_body(ErrorStyle.ANTHROPIC, unavailable, "r"))["error"]["type"] == "overloaded_error"
    assert orjson.loads(error_body(ErrorStyle.OPENAI, unavailable, "r"))["error"]["type"] == "api_error"


def test_stream_error_events() -> None:
    openai = stream_error_event(ErrorStyle.OPENAI, "broke")
    assert openai.startswith(b"data: ") and orjson.loads(openai[6:])["error"]["message"] == "broke"
    anthropic = stream_error_event(ErrorStyle.ANTHROPIC, "broke")
    event, data = anthropic.split(b"\n", 1)
    assert event == b"event: error" and orjson.loads(data[6:])["error"]["type"] == "api_error"


@pytest.mark.parametrize(
    ("api", "body", "start"),
    [
        (Api.CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, True),
        (
            Api.CHAT,
            {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]},
            True,
        ),
        (
            Api.CHAT,
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "more"},
                ],
            },
            False,
        ),
        (Api.MESSAGES, {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, True),
        (
            Api.MESSAGES,
            {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "prefill"}],
            },
            False,
        ),
        (Api.COMPLETIONS, {"model": "m", "prompt": "hi"}, False),
        (Api.EMBEDDINGS, {"model": "m", "input": "hi"}, False),
    ],
)
def test_conversation_start(api: Api, body: dict[str, object], start: bool) -> None:
    assert conversation_start(parse_request(api, orjson.dumps(body))) is start
