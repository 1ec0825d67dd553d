"""The fleet benchmark's Responses form of a chat request: the engine must template the same
prompt, so the ideal cache and the hit figures keep their meaning."""

from __future__ import annotations

from continuum_bench.fleet.responses_form import (
    StoredTurn,
    event_response_id,
    event_text,
    event_usage,
    responses_body,
)
from continuum_common.hashing.responses_input import responses_messages


def test_the_responses_form_has_the_same_messages() -> None:
    messages = [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    body = responses_body({"messages": messages, "max_tokens": 7, "temperature": 0})
    assert body["instructions"] == "Sys" and body["max_output_tokens"] == 7 and body["temperature"] == 0
    assert "messages" not in body and "max_tokens" not in body
    assert responses_messages(body) == messages
    no_system = responses_body({"messages": messages[1:]})
    assert "instructions" not in no_system and responses_messages(no_system) == messages[1:]


def test_stream_events_give_text_and_chat_shaped_usage() -> None:
    assert event_text({"type": "response.output_text.delta", "delta": "hi"}) == "hi"
    assert event_text({"type": "response.created", "response": {}}) is None
    final = {
        "type": "response.incomplete",
        "response": {"usage": {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 5}},
    }
    assert event_usage(final) == {
        "prompt_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 32},
        "completion_tokens": 5,
    }
    assert event_usage({"type": "response.output_text.done"}) is None


def test_a_stored_turn_continues_the_conversation_by_its_id() -> None:
    first = {"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "a"}], "max_tokens": 7}
    turn = StoredTurn()
    assert turn.body(first) == responses_body(first)  # nothing stored yet: the whole conversation
    turn.answered(first, "resp_1", "b")
    second = {"messages": [*first["messages"], {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}
    body = turn.body(second)
    assert body == {"input": [{"role": "user", "content": "c"}], "previous_response_id": "resp_1"}
    # what the engine templates: its stored conversation (instructions, a, b) + the new input
    stored = responses_messages(responses_body({"messages": turn.messages}))
    assert [*stored, *responses_messages(body)] == second["messages"]
    other = {"messages": [{"role": "user", "content": "unrelated"}]}
    assert "previous_response_id" not in turn.body(other)  # not an extension: sent whole
    turn.answered(second, None, "")  # a failed turn: the next one goes whole
    assert "previous_response_id" not in turn.body(
        {"messages": [*second["messages"], {"role": "user", "content": "d"}]}
    )
    assert event_response_id({"type": "response.created", "response": {"id": "resp_2"}}) == "resp_2"
    assert event_response_id({"type": "response.completed", "response": {"id": "resp_2"}}) is None
