"""The simulated engine's response store: a bounded LRU of response id → conversation."""

from __future__ import annotations

import pytest

from continuum_sim import EngineConfig
from continuum_sim.cli import build_parser, configs_from_args
from continuum_sim.errors import SimConfigError
from continuum_sim.protocol.chat_template import ChatMessage
from continuum_sim.protocol.response_store import ResponseStore


def _turn(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text), ChatMessage("assistant", text.upper())]


def test_the_store_forgets_the_least_recently_used_response_beyond_its_capacity() -> None:
    store = ResponseStore(2)
    store.put("resp_a", _turn("a"))
    store.put("resp_b", _turn("b"))
    assert store.get("resp_a") == tuple(_turn("a"))  # a is now the most recently used
    store.put("resp_c", _turn("c"))
    assert len(store) == 2
    assert "resp_b" not in store and store.get("resp_b") is None
    assert store.get("resp_a") is not None and store.get("resp_c") == tuple(_turn("c"))


def test_storing_an_id_again_replaces_it_and_counts_as_a_use() -> None:
    store = ResponseStore(2)
    store.put("resp_a", _turn("a"))
    store.put("resp_b", _turn("b"))
    store.put("resp_a", _turn("x"))
    store.put("resp_c", _turn("c"))
    assert store.get("resp_a") == tuple(_turn("x")) and "resp_b" not in store


def test_a_store_of_capacity_zero_keeps_nothing() -> None:
    store = ResponseStore(0)
    store.put("resp_a", _turn("a"))
    assert len(store) == 0 and store.get("resp_a") is None
    with pytest.raises(ValueError):
        ResponseStore(-1)


def test_the_cli_option_sets_the_engines_store_size() -> None:
    assert [c.responses_store for c in configs_from_args(build_parser().parse_args(["--count", "2"]))] == [
        10_000,
        10_000,
    ]
    configs = configs_from_args(build_parser().parse_args(["--responses-store", "0"]))
    assert configs[0].responses_store == 0
    with pytest.raises(SimConfigError):
        EngineConfig(responses_store=-1)
