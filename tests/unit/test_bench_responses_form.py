"""The fleet benchmark's Responses form of a chat request: the engine must template the same
prompt, so the ideal cache and the hit figures keep their meaning."""

from __future__ import annotations

from continuum_bench.fleet.responses_form import event_text, event_usage, responses_body
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
