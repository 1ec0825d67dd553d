"""The simulated engine's response store: a bounded LRU of response id → the conversation and
the response object its client received; and the shapes of the stored-response routes."""

from __future__ import annotations

from typing import Any

import pytest

from continuum_sim import EngineConfig
from continuum_sim.cli import build_parser, configs_from_args
from continuum_sim.errors import ResponseNotFound, SimConfigError
from continuum_sim.protocol import responses_api as ra
from continuum_sim.protocol.chat_template import ChatMessage
from continuum_sim.protocol.response_store import ResponseStore, StoredResponse


def _turn(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text), ChatMessage("assistant", text.upper())]


def _response(rid: str) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": "completed"}


def _put(store: ResponseStore, rid: str, text: str) -> None:
    store.put(rid, _turn(text), _response(rid))


def _conversation(store: ResponseStore, rid: str) -> tuple[ChatMessage, ...] | None:
    entry = store.get(rid)
    return None if entry is None else entry.conversation


def test_the_store_forgets_the_least_recently_used_response_beyond_its_capacity() -> None:
    store = ResponseStore(2)
    _put(store, "resp_a", "a")
    _put(store, "resp_b", "b")
    assert _conversation(store, "resp_a") == tuple(_turn("a"))  # a is now the most recently used
    _put(store, "resp_c", "c")
    assert len(store) == 2
    assert "resp_b" not in store and store.get("resp_b") is None
    assert store.get("resp_a") is not None and _conversation(store, "resp_c") == tuple(_turn("c"))


def test_storing_an_id_again_replaces_it_and_counts_as_a_use() -> None:
    store = ResponseStore(2)
    _put(store, "resp_a", "a")
    _put(store, "resp_b", "b")
    store.put("resp_a", _turn("x"), {"id": "resp_a", "status": "incomplete"})
    _put(store, "resp_c", "c")
    entry = store.get("resp_a")
    assert entry == StoredResponse(tuple(_turn("x")), {"id": "resp_a", "status": "incomplete"})
    assert "resp_b" not in store


def test_a_store_of_capacity_zero_keeps_nothing() -> None:
    store = ResponseStore(0)
    _put(store, "resp_a", "a")
    assert len(store) == 0 and store.get("resp_a") is None
    assert store.delete("resp_a") is False
    with pytest.raises(ValueError):
        ResponseStore(-1)


def test_a_stored_response_keeps_the_object_its_client_received_next_to_the_conversation() -> None:
    store = ResponseStore(2)
    answered = {"id": "resp_a", "object": "response", "status": "incomplete", "output": []}
    store.put("resp_a", [ChatMessage("system", "Be brief."), *_turn("a")], answered)
    entry = store.get("resp_a")
    assert entry is not None and entry.response == answered
    assert entry.input_messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "a"))  # not the answer


def test_a_deleted_response_is_gone_and_frees_its_place() -> None:
    store = ResponseStore(2)
    _put(store, "resp_a", "a")
    _put(store, "resp_b", "b")
    assert store.delete("resp_a") is True
    assert "resp_a" not in store and store.get("resp_a") is None and len(store) == 1
    assert store.delete("resp_a") is False  # twice: nothing left to delete
    _put(store, "resp_c", "c")
    assert "resp_b" in store and "resp_c" in store  # the deleted one's place, no eviction


def test_input_items_are_the_prompts_messages_with_ids_by_position() -> None:
    conversation = [ChatMessage("system", "Be brief."), *_turn("a"), ChatMessage("developer", "d"), *_turn("b")]
    stored = StoredResponse(tuple(conversation), _response("resp_f00"))
    page = ra.input_items("resp_f00", stored)
    ids = [f"msg_f00_{i}" for i in range(5)]
    assert page == {
        "object": "list",
        "data": [
            {"type": "message", "id": ids[0], "status": "completed", "role": "system",
             "content": [{"type": "input_text", "text": "Be brief."}]},
            {"type": "message", "id": ids[1], "status": "completed", "role": "user",
             "content": [{"type": "input_text", "text": "a"}]},
            {"type": "message", "id": ids[2], "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "A", "annotations": []}]},
            {"type": "message", "id": ids[3], "status": "completed", "role": "developer",
             "content": [{"type": "input_text", "text": "d"}]},
            {"type": "message", "id": ids[4], "status": "completed", "role": "user",
             "content": [{"type": "input_text", "text": "b"}]},
        ],
        "first_id": ids[0],
        "last_id": ids[4],
        "has_more": False,
    }  # fmt: skip
    assert ra.input_items("resp_f00", stored) == page  # the same ids on every call


def test_an_unknown_id_in_the_path_is_not_found_without_a_param() -> None:
    store = ResponseStore(2)
    with pytest.raises(ResponseNotFound) as raised:
        ra.stored_response(store, "resp_gone")
    assert raised.value.status == 404 and raised.value.param is None
    assert raised.value.message == "Response with id 'resp_gone' not found."
    assert ra.deleted_response("resp_gone") == {"id": "resp_gone", "object": "response.deleted", "deleted": True}


def test_the_cli_option_sets_the_engines_store_size() -> None:
    assert [c.responses_store for c in configs_from_args(build_parser().parse_args(["--count", "2"]))] == [
        10_000,
        10_000,
    ]
    configs = configs_from_args(build_parser().parse_args(["--responses-store", "0"]))
    assert configs[0].responses_store == 0
    with pytest.raises(SimConfigError):
        EngineConfig(responses_store=-1)
