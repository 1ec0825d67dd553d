"""The config holder: validated swaps, rejected reloads keep the running snapshot, in-flight
snapshots stay referenced, restart-only sections are reported."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from continuum_common.errors import ConfigError
from continuum_ingress.adapters.upstream import ClientSet
from continuum_ingress.config_holder import ConfigHolder, restart_only_changes
from continuum_ingress.pool import BackendPool
from continuum_ingress.protocol.apis import Api
from continuum_ingress.protocol.dialects import default_dialects
from continuum_ingress.snapshot import SnapshotFactory
from continuum_testing.ingress_harness import router_config


def _write(path: Path, data: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _cfg(*names: str, strategy: str = "RoundRobin") -> dict[str, object]:
    return {
        "selection_strategy": strategy,
        "backends": [
            {"name": n, "url": f"http://127.0.0.1:{9000 + i}", "type": "vllm", "models": ["m"]}
            for i, n in enumerate(names)
        ],
    }


def _holder(source: Path) -> tuple[ConfigHolder, ClientSet]:
    clients = ClientSet()
    factory = SnapshotFactory(BackendPool(), clients, default_dialects())
    return ConfigHolder(source, factory.build), clients


def test_reload_swaps_and_bad_files_keep_the_running_snapshot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "c.yaml", _cfg("a", "b"))
    holder, _ = _holder(path)
    first = holder.acquire()  # a request in flight
    assert first.route(Api.CHAT, "m") == ("a", "b")
    _write(path, _cfg("a", "c", strategy="WeightedRoundRobin"))
    assert holder.file_changed()
    assert holder.reload()
    assert holder.current.route(Api.CHAT, "m") == ("a", "c")
    assert holder.current.strategy.kind.value == "WeightedRoundRobin"
    assert first.route(Api.CHAT, "m") == ("a", "b")  # the in-flight request's view is unchanged
    assert holder.current.clients["a"] is first.clients["a"]  # unchanged backend keeps its client
    assert holder.retired_idle() == []  # still used
    holder.release(first)
    assert holder.retired_idle() == [first]
    caplog.set_level(logging.ERROR)
    path.write_text("backends: [ {name: 'bad name!', url: nope} ]")
    assert not holder.reload()
    assert holder.current.route(Api.CHAT, "m") == ("a", "c")
    assert "backends[0].name" in caplog.text and holder.reloads_failed == 1


def test_missing_secret_fails_reload_without_touching_live_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "c.yaml", _cfg("a"))
    holder, _ = _holder(path)
    data = _cfg("a", "b")
    data["backends"][1]["api_key_env"] = "CONTINUUM_TEST_MISSING_KEY"  # type: ignore[index]
    monkeypatch.delenv("CONTINUUM_TEST_MISSING_KEY", raising=False)
    _write(path, data)
    assert not holder.reload()
    assert tuple(holder.current.backends) == ("a",)
    monkeypatch.setenv("CONTINUUM_TEST_MISSING_KEY", "sk-x")
    assert holder.reload() and holder.current.api_keys["b"] == "sk-x"


def test_first_load_errors_are_raised(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("selection_strategy: Fastest\n")
    with pytest.raises(ConfigError) as info:
        _holder(path)
    assert any(p.startswith("selection_strategy") for p in info.value.problems)


def test_restart_only_changes_are_named() -> None:
    old = router_config(_cfg("a"))
    new = router_config({**_cfg("a"), "server": {"port": 9999}, "kv_cache_index": {"enabled": True}})
    assert restart_only_changes(old, new) == ["kv_cache_index", "server.port"]
    hot = router_config({**_cfg("a", "b"), "prefix_routing": {"enabled": True, "virtual_nodes": 10}})
    assert restart_only_changes(old, hot) == []


def test_routes_wildcards_and_internal_backends() -> None:
    clients = ClientSet()
    factory = SnapshotFactory(BackendPool(), clients, default_dialects())
    snapshot = factory.build(
        router_config(
            {
                "backends": [
                    {"name": "v", "url": "http://127.0.0.1:1", "type": "vllm", "models": ["m"]},
                    {"name": "any", "url": "http://127.0.0.1:2", "type": "openai"},
                    {"name": "claude", "url": "http://127.0.0.1:3", "type": "anthropic", "models": ["c"]},
                    {"name": "emb", "url": "http://127.0.0.1:4", "type": "openai", "models": ["e"], "internal": True},
                    {"name": "off", "url": "http://127.0.0.1:5", "type": "vllm", "models": ["m"], "enabled": False},
                ]
            }
        ),
        1,
    )
    assert snapshot.route(Api.CHAT, "m") == ("v", "any")
    assert snapshot.route(Api.CHAT, "unlisted") == ("any",)  # an empty models list serves any model
    assert snapshot.route(Api.MESSAGES, "m") == ("v",)
    assert snapshot.route(Api.MESSAGES, "c") == ("claude",)
    assert snapshot.route(Api.CHAT, "c") == ("any",)
    assert snapshot.route(Api.CHAT, "e") == ("any",)  # internal backends take no client traffic
    assert set(snapshot.clients) == {"v", "any", "claude", "emb"}  # but they get a client
    assert snapshot.models == ("m", "c")


def test_every_backend_pool_shares_one_outbox_across_reloads(tmp_path: Path) -> None:
    """One turn's requests to all backends leave together: the default transports share one Outbox."""
    from continuum_ingress.adapters.h1 import H1Pool

    path = _write(tmp_path / "c.yaml", _cfg("a", "b"))
    holder, _ = _holder(path)
    first = holder.current
    _write(path, _cfg("a", "c"))
    assert holder.file_changed() and holder.reload()
    pools = [first.clients["a"].transport, first.clients["b"].transport, holder.current.clients["c"].transport]
    assert all(isinstance(p, H1Pool) for p in pools)
    assert len({id(p._outbox) for p in pools}) == 1  # type: ignore[attr-defined]
