"""`continuum-router up --topology multi`: every service a process of its own (a redis-server,
the KV listener, 2 indexers, the router as 2 replicas on one port), driven in-process through
`up()` against the demo engines; requests flow, both replicas serve, the KV index fills in Redis
through the indexers, SIGHUP-style reloads reach the router, and nothing outlives `up`."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import yaml

from continuum_common.children import process_alive
from tests.e2e.test_kv_up import chat, continued, running_up, words


def replicas_serving(metrics: str) -> set[str]:
    return {
        m.group(1)
        for m in re.finditer(r'continuum_ingress_requests_total\{[^}]*worker="(\d+)"[^}]*\} ([0-9.]+)', metrics)
        if float(m.group(2)) > 0
    }


def kv_aware(metrics: str) -> float:
    """kv_aware decisions of every replica (the merged /metrics carries a `worker` label)."""
    pattern = r'continuum_kv_index_routing_decisions_total\{[^}]*decision="kv_aware"[^}]*\} ([0-9.]+)'
    return sum(float(v) for v in re.findall(pattern, metrics))


async def until_kv_aware(http: httpx.AsyncClient, url: str, body: dict[str, object]) -> None:
    async with asyncio.timeout(30):
        while True:
            assert (await http.post(url + "/v1/chat/completions", json=body)).status_code == 200
            if kv_aware((await http.get(url + "/metrics")).text) >= 1:
                return
            await asyncio.sleep(0.3)


async def test_up_multi_runs_each_service_as_a_process(tmp_path: Path) -> None:
    state = tmp_path / ".continuum"
    multi = running_up(tmp_path, config_path=None, demo=True, topology="multi", replicas=2)
    async with multi as url, httpx.AsyncClient(timeout=30) as http:
        router = yaml.safe_load((state / "multi" / "router.yaml").read_text())
        assert router["server"]["workers"] == 2 and router["kv_cache_index"]["backend"] == "redis"
        assert router["bus"]["embedded"] is False and router["redis"]["url"].startswith("redis://")
        lock = json.loads((state / "up.lock").read_text())
        children = {c["name"]: c["pid"] for c in lock["children"]}
        assert {"redis", "listener", "indexer-0", "indexer-1", "ingress", "nats-server"} <= set(children)
        body = continued(chat("You are the multi-process demo. " + words("multi", 40), "hello"))
        body["model"] = "continuum-sim-8b"
        await until_kv_aware(http, url, body)  # engine events -> listener -> NATS -> indexers -> Redis
        for _ in range(24):  # new connections: the kernel spreads them over both replicas
            async with httpx.AsyncClient(timeout=30) as fresh:
                assert (await fresh.post(url + "/v1/chat/completions", json=body)).status_code == 200
        serving = replicas_serving((await http.get(url + "/metrics")).text)
        assert serving == {"0", "1"}, serving
        token = (state / "admin-token").read_text().strip()
        stats = (await http.get(url + "/admin/kv-index/stats", headers={"authorization": f"Bearer {token}"})).json()
        assert stats["config"]["backend"] == "redis" and stats["index_source"] == "indexer"
        assert (stats["blocks"] or {}).get("block_count", 0) > 0
    # `up` stopped every process it started.
    for _ in range(50):
        if not any(process_alive(pid) for pid in children.values()):
            break
        await asyncio.sleep(0.1)
    assert [name for name, pid in children.items() if process_alive(pid)] == []
