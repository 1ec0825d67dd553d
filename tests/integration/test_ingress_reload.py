"""/admin auth, and hot reload (file change and POST /admin/config/reload) changing backends and
strategy while requests are in flight."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from continuum_common.config import RouterConfig
from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_admin_is_locked_without_a_configured_token() -> None:
    async with (
        running_stubs("a") as stubs,
        running_ingress({"backends": stub_backends(stubs)}) as ing,
        httpx.AsyncClient(base_url=ing.url, verify=False) as c,
    ):
        for headers in ({}, {"authorization": "Basic abc"}, {"authorization": "Bearer anything"}):
            r = await c.get("/admin/prefix-routing/stats", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert (await c.post("/admin/config/reload")).status_code == 401


async def test_admin_token_from_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text("first-token\nsecond-token\n")
    async with running_stubs("a") as stubs:
        cfg = {"backends": stub_backends(stubs), "admin": {"token_file": str(token_file)}}
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, verify=False) as c:
            assert (await c.get("/admin/backends", headers={"authorization": "Bearer wrong"})).status_code == 401
            assert (await c.get("/admin/backends", headers={"authorization": "bearer first-token"})).status_code == 200
            r = await c.get("/admin/backends", headers={"authorization": "Bearer second-token"})
            assert r.status_code == 200
            backend = r.json()["backends"][0]
            assert backend["name"] == "a" and backend["healthy"] is True and backend["circuit"] == "closed"
            assert (await c.get("/admin/nothing", headers={"authorization": "Bearer first-token"})).status_code == 404
        monkeypatch.setenv("CONTINUUM_TEST_ADMIN_TOKEN", "env-token")
        cfg = {"backends": stub_backends(stubs), "admin": {"token_env": "CONTINUUM_TEST_ADMIN_TOKEN"}}
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, verify=False) as c:
            assert (await c.get("/admin/backends", headers={"authorization": "Bearer env-token"})).status_code == 200
            assert (await c.get("/admin/backends", headers={"authorization": "Bearer first-token"})).status_code == 401


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    tmp.replace(path)  # atomic, as editors and config managers do


async def test_hot_reload_changes_backends_and_strategy_without_failing_requests_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    async with running_stubs("a", "b", "c") as stubs:
        a, b, _ = (s.stub for s in stubs)
        first = {"backends": stub_backends(stubs[:2]), "selection_strategy": "RoundRobin"}
        _write(path, first)
        async with (
            running_ingress(path, reload_interval=0.05) as ing,
            httpx.AsyncClient(base_url=ing.url, verify=False, timeout=10) as client,
        ):
            # Requests in flight on `a`: a slow stream and a slow non-streamed answer.
            a.chunk_delay = 0.15
            stream_task = asyncio.create_task(client.post("/v1/chat/completions", json={**BODY, "stream": True}))
            while len(a.requests) < 1:
                await asyncio.sleep(0.005)
            slow_task = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))  # RoundRobin -> b
            while len(b.requests) < 1:
                await asyncio.sleep(0.005)
            # Reload: drop `a`, add `c`, weights 1:3 under WeightedRoundRobin.
            second = {"backends": stub_backends(stubs[1:]), "selection_strategy": "WeightedRoundRobin"}
            second["backends"][1]["weight"] = 3
            _write(path, second)
            for _ in range(100):
                if ing.app.holder.current.generation == 2:
                    break
                await asyncio.sleep(0.02)
            assert ing.app.holder.current.generation == 2
            streamed, slow = await asyncio.gather(stream_task, slow_task)
            assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
            assert streamed.headers["x-continuum-backend"] == "a"
            assert slow.status_code == 200
            a.chunk_delay = 0
            served = collections.Counter()
            for _ in range(8):
                r = await client.post("/v1/chat/completions", json=BODY)
                served[r.headers["x-continuum-backend"]] += 1
            assert served == {"b": 2, "c": 6}
            # A broken file is rejected and the running configuration stays.
            path.write_text("backends: {not: a list}\n")
            await asyncio.sleep(0.3)
            assert ing.app.holder.current.generation == 2 and ing.app.holder.reloads_failed >= 1
            r = await client.post("/v1/chat/completions", json=BODY)
            assert r.status_code == 200
            # Once no request holds it, the retired snapshot's client for `a` is closed.
            for _ in range(60):
                if not ing.app.holder._retired:
                    break
                await asyncio.sleep(0.05)
            assert ing.app.holder._retired == []
            reloads = (await client.get("/metrics")).text
            assert 'continuum_config_reloads_total{result="ok"} 1.0' in reloads


async def test_admin_reload_endpoint_and_prefix_routing_knobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTINUUM_TEST_ADMIN_TOKEN", "t")
    path = tmp_path / "router.yaml"
    async with running_stubs("a", "b", "c") as stubs:
        base = {
            "backends": stub_backends(stubs),
            "selection_strategy": "PrefixAwareHash",
            "prefix_routing": {"enabled": True, "virtual_nodes": 150},
            "admin": {"token_env": "CONTINUUM_TEST_ADMIN_TOKEN"},
        }
        _write(path, base)
        auth = {"authorization": "Bearer t"}
        async with (
            running_ingress(path, reload_interval=0) as ing,
            httpx.AsyncClient(base_url=ing.url, verify=False) as client,
        ):
            ring_before = ing.app.holder.current.strategy
            _write(path, {**base, "prefix_routing": {"enabled": True, "virtual_nodes": 7, "load_factor_epsilon": 0.5}})
            r = await client.post("/admin/config/reload", headers=auth)
            assert r.status_code == 200 and r.json() == {"success": True, "generation": 2}
            stats = (await client.get("/admin/prefix-routing/stats", headers=auth)).json()
            assert stats["config"]["virtual_nodes"] == 7 and stats["config"]["load_factor_epsilon"] == 0.5
            assert ing.app.holder.current.strategy is not ring_before  # a new ring
            r = await client.post(
                "/v1/chat/completions",
                json={**BODY, "messages": [{"role": "system", "content": "s"}, *BODY["messages"]]},
            )
            assert r.status_code == 200
            path.write_text("selection_strategy: Nope\n")
            r = await client.post("/admin/config/reload", headers=auth)
            assert r.status_code == 422 and r.json()["success"] is False


class Recorder:
    """A Component that records its lifecycle calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    def reload(self, config: RouterConfig) -> None:
        self.calls.append(f"reload:{config.selection_strategy.value}")

    async def aclose(self) -> None:
        self.calls.append("aclose")


async def test_components_follow_the_lifespan_and_accepted_reloads(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    component = Recorder()
    async with running_stubs("a") as stubs:
        _write(path, {"backends": stub_backends(stubs)})
        async with running_ingress(path, reload_interval=0, components=[component]) as ing:
            assert component.calls == ["start"]
            _write(path, {"backends": stub_backends(stubs), "selection_strategy": "Random"})
            assert ing.app.reload()
            path.write_text("nonsense: [")
            assert not ing.app.reload()
        assert component.calls == ["start", "reload:Random", "aclose"]
