"""The compose stack cannot be started here (no Docker engine), so check what can be checked
statically: the files parse, every Continuum command exists, every mounted config validates
against the real schemas, and the wiring between files agrees."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

from continuum_common.config import load_listener_config, load_router_config

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"
ROOT = COMPOSE.parents[1]


def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_every_continuum_command_is_a_console_script() -> None:
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    commands = [s["command"][0] for s in compose()["services"].values() if s.get("image") == "continuum:local"]
    assert commands and set(commands) <= scripts


def test_mounted_configs_validate() -> None:
    router = load_router_config(COMPOSE / "config" / "router.yaml")
    listener = load_listener_config(COMPOSE / "config" / "kv-listener.yaml")
    backends = {b.name for b in router.backends}
    assert {s.backend_name for s in listener.sources} == backends
    assert {s.backend_name for s in router.kv_cache_index.event_sources} == backends
    for service in compose()["services"].values():
        for arg in service.get("command", []):
            if isinstance(arg, str) and arg.startswith("/etc/continuum/"):
                assert (COMPOSE / "config" / arg.removeprefix("/etc/continuum/")).is_file(), arg


def test_listener_may_publish_exactly_its_backends() -> None:
    nats_conf = (COMPOSE / "config" / "nats.conf").read_text()
    listener = load_listener_config(COMPOSE / "config" / "kv-listener.yaml")
    for source in listener.sources:
        assert f'"continuum.kv.events.{source.backend_name}"' in nats_conf
    assert "continuum.kv.events.>" not in nats_conf.split("kv-listener-a")[1]


def test_secrets_referenced_by_configs_are_declared() -> None:
    declared = set(compose()["secrets"])
    text = (COMPOSE / "config" / "router.yaml").read_text() + (COMPOSE / "config" / "kv-listener.yaml").read_text()
    used = {line.split("/run/secrets/")[1].split()[0] for line in text.splitlines() if "/run/secrets/" in line}
    assert used and used <= declared


def test_dashboard_queries_use_metric_names_the_code_registers() -> None:
    dashboard = json.loads((COMPOSE / "grafana" / "dashboards" / "continuum.json").read_text())
    source = "\n".join(p.read_text() for p in (ROOT / "services").rglob("*.py"))
    source += "\n".join(p.read_text() for p in (ROOT / "libs").rglob("*.py"))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for token in re.findall(r"continuum_[a-z_]+", target["expr"]):
                base = token
                for suffix in ("_total", "_bucket"):
                    base = base.removesuffix(suffix)
                assert f'"{base}' in source, f"{panel['title']}: {token} is not registered anywhere"
