"""`continuum-router up` runs Tier 4: the KV listener and (with a Redis index) the indexer next
to the ingress, on the embedded nats-server. Driven in-process through `up()` (the console
script is covered by test_up_demo.py); engines, NATS and Redis are real."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from continuum_common.procs import RedisServer
from continuum_router.up import up
from continuum_sim import SimFleet
from continuum_testing.kv_stack import chat, words


@contextlib.asynccontextmanager
async def running_up(tmp_path: Path, **kwargs: Any) -> AsyncIterator[str]:
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        up(stop=stop, on_ready=ready.set_result, state_dir=tmp_path / ".continuum", port=0, **kwargs)
    )
    try:
        done, _ = await asyncio.wait({task, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        assert ready.done(), "up did not become ready"
        yield ready.result()
    finally:
        stop.set()
        async with asyncio.timeout(30):
            await task


def kv_decisions(metrics: str, decision: str) -> float:
    pattern = rf'continuum_kv_index_routing_decisions_total{{decision="{decision}",tier="\w+"}} ([0-9.]+)'
    return sum(float(v) for v in re.findall(pattern, metrics))


def continued(body: dict[str, Any]) -> dict[str, Any]:
    """The request as a later turn of its conversation (a first turn is placed for balance, and
    counted as `placed`, not `kv_aware`)."""
    first = body["messages"]
    return {
        **body,
        "messages": [*first, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "More."}],
    }


async def until_kv_aware(http: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float = 20.0) -> None:
    """Repeat the request until one is routed by the KV index (the first one teaches it)."""
    async with asyncio.timeout(timeout):
        while True:
            assert (await http.post(url + "/v1/chat/completions", json=body)).status_code == 200
            if kv_decisions((await http.get(url + "/metrics")).text, "kv_aware") >= 1:
                return
            await asyncio.sleep(0.3)


async def test_up_demo_routes_by_the_kv_index(tmp_path: Path) -> None:
    async with running_up(tmp_path, config_path=None, demo=True) as url, httpx.AsyncClient(timeout=30) as http:
        state = tmp_path / ".continuum"
        written = yaml.safe_load((state / "demo-config.yaml").read_text())
        kv = written["kv_cache_index"]
        assert kv["enabled"] and kv["groups"][0]["mode"] == "precise" and kv["groups"][0]["hash_seed"] == "0"
        assert (state / "admin-token").stat().st_mode & 0o777 == 0o600
        listener = yaml.safe_load((state / "demo-listener.yaml").read_text())
        assert len(listener["sources"]) == 3 and all(s["publish"] == "blocks" for s in listener["sources"])
        body = continued(chat("You are the demo assistant. " + words("demo", 40), "hello"))
        body["model"] = "continuum-sim-8b"
        # A speculative entry may already route the second request; the engine's own block
        # events (listener -> JetStream -> embedded block index) keep routing it afterwards.
        await until_kv_aware(http, url, body)
        token = (state / "admin-token").read_text().strip()
        stats = (await http.get(url + "/admin/kv-index/stats", headers={"authorization": f"Bearer {token}"})).json()
        assert stats["config"]["backend"] == "memory" and stats["routing_decisions"]["kv_aware"] >= 1
        async with asyncio.timeout(10):
            while not any(s["reporter"] == "listener" for s in stats["event_sources"]):  # first heartbeat
                await asyncio.sleep(0.5)
                stats = (
                    await http.get(url + "/admin/kv-index/stats", headers={"authorization": f"Bearer {token}"})
                ).json()
        async with asyncio.timeout(10):  # the engine's block events reach the embedded index
            while not (stats["blocks"] or {}).get("block_count"):
                await asyncio.sleep(0.3)
                stats = (
                    await http.get(url + "/admin/kv-index/stats", headers={"authorization": f"Bearer {token}"})
                ).json()
        assert stats["config"]["groups"] == {"demo": "precise", "*": "approximate"}


async def test_up_with_a_redis_index_runs_listener_and_indexer(tmp_path: Path, redis_server: RedisServer) -> None:
    async with SimFleet(2, time_scale=0.01) as fleet:
        config = {
            "server": {"host": "127.0.0.1", "port": 0},
            "selection_strategy": "RoundRobin",
            "prefix_routing": {"enabled": True},
            "bus": {"embedded": True, "data_dir": str(tmp_path / "nats")},
            "redis": {"url": redis_server.url},
            # precise matching without speculative entries: a KV-aware decision needs the engine's
            # block events to have gone listener -> JetStream -> indexer -> Redis
            "kv_cache_index": {
                "enabled": True,
                "backend": "redis",
                "speculative_ttl_ms": 0,
                "groups": [{"name": "sims", "models": [fleet.endpoints[0].model], "mode": "precise", "hash_seed": "0"}],
            },
            "backends": fleet.router_backends(),
        }
        listener = {
            "listen": "127.0.0.1:0",
            "bus": {"url": "nats://127.0.0.1:1"},  # replaced by the embedded server's URL
            "sources": [{**s, "publish": "blocks"} for s in fleet.listener_sources()],
        }
        (tmp_path / "router.yaml").write_text(yaml.safe_dump(config))
        (tmp_path / "listener.yaml").write_text(yaml.safe_dump(listener))
        async with (
            running_up(
                tmp_path, config_path=str(tmp_path / "router.yaml"), listener_config=str(tmp_path / "listener.yaml")
            ) as url,
            httpx.AsyncClient(timeout=30) as http,
        ):
            body = continued(chat("System prompt for the redis index. " + words("redis", 40), "hello", max_tokens=32))
            await until_kv_aware(http, url, body)
