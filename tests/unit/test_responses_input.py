"""An OpenAI Responses request as chat messages (continuum_common.hashing.responses_input), and
what the ingress derives from it: its routing-key view, its prefix key, conversation starts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from continuum_common.hashing import request_prefix_key
from continuum_common.hashing.responses_input import (
    ResponsesInputError,
    responses_chat_body,
    responses_messages,
    responses_tools,
)
from continuum_ingress.errors import InvalidRequest
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.requests import conversation_start, parse_request


def test_instructions_and_a_string_input_are_a_system_and_a_user_message() -> None:
    body = {"instructions": "Be brief.", "input": "Hello"}
    assert responses_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    assert responses_messages({"instructions": "", "input": "Hello"}) == [{"role": "user", "content": "Hello"}]
    assert responses_messages({}) == []


def test_input_items_keep_roles_text_parts_and_tool_calls_and_leave_out_the_rest() -> None:
    body = {
        "input": [
            {"role": "developer", "content": "Rules."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_image"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "item_reference", "id": "msg_1"},
            {"role": "user", "content": [{"type": "input_text", "text": "c"}, {"type": "input_text", "text": "d"}]},
        ]
    }
    assert responses_messages(body) == [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "user", "content": "c\nd"},  # joined as vLLM joins text parts before templating
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"instructions": 3}, "instructions"),
        ({"input": {"role": "user"}}, "input"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": ["x"]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": None}]}]}, "input[0].content[0].text"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": 1}]}, "input[0]"),
        ({"input": [{"type": 7}]}, "input[0].type"),
    ],
)
def test_malformed_input_names_the_parameter(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ResponsesInputError) as caught:
        responses_messages(body)
    assert caught.value.param == param


def test_function_tools_take_the_chat_shape_and_built_in_tools_are_left_out() -> None:
    tools = [
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True},
        {"type": "web_search"},
    ]
    chat = [
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert responses_tools({"tools": tools}) == chat
    body = responses_chat_body({"model": "m", "input": "x", "tools": tools, "cache_salt": "s"})
    assert body == {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": chat, "cache_salt": "s"}


def _parse(api: Api, body: dict[str, Any]) -> Any:
    return parse_request(api, orjson.dumps(body))


def test_a_responses_request_is_keyed_by_its_chat_form() -> None:
    request = _parse(Api.RESPONSES, {"model": "m", "instructions": "Sys", "input": "Hi"})
    assert request.api is Api.RESPONSES and request.key_api is Api.CHAT
    assert request.key_body["messages"] == [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]
    chat = {"model": "m", "messages": request.key_body["messages"]}
    key = request_prefix_key(request.key_body, enabled=True)
    assert key is not None and key == request_prefix_key(chat, enabled=True)


def test_a_request_continuing_a_stored_response_is_keyless() -> None:
    request = _parse(Api.RESPONSES, {"model": "m", "input": "Hi", "previous_response_id": "resp_1"})
    assert request.key_api is Api.RESPONSES and request.key_body is request.body
    assert not conversation_start(request)


def test_conversation_starts_are_told_from_the_input_items() -> None:
    start = _parse(Api.RESPONSES, {"model": "m", "instructions": "Sys", "input": "Hi"})
    later = _parse(
        Api.RESPONSES,
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "More"},
            ],
        },
    )
    assert conversation_start(start) and not conversation_start(later)


def test_the_ingress_refuses_malformed_input_items_with_the_parameter() -> None:
    with pytest.raises(InvalidRequest) as caught:
        _parse(Api.RESPONSES, {"model": "m", "input": [{"role": "robot", "content": "x"}]})
    assert caught.value.param == "input[0].role"
