"""An ingress process holds one NATS connection, whatever uses the bus in it: KV routing (its
embedded index's feed, indexer admin, routing decisions), the load reports between replicas
and the Gemini context cache's client. Counted by the real nats-server's monitoring endpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from continuum_common.procs import NatsServer, free_port
from continuum_testing.ingress_harness import running_ingress
from continuum_testing.upstream_stub import running_stubs
from tests.integration.test_kv_selector_ingress import kv_config


async def connz(monitor: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        reply = await client.get(f"http://127.0.0.1:{monitor}/connz")
        reply.raise_for_status()
        body: dict[str, Any] = reply.json()
        return body


async def test_one_ingress_holds_one_nats_connection(tmp_path: Path) -> None:
    monitor = free_port()
    server = NatsServer(tmp_path / "nats", config=f'http: "127.0.0.1:{monitor}"')
    await server.start()
    try:
        async with running_stubs("a") as stubs:
            cfg = {
                **kv_config(stubs, server.url),
                "load_sharing": {"bus": "always", "interval_ms": 50},
                "gemini_context_cache": {"enabled": True},
            }
            async with running_ingress(cfg) as ing:
                app = ing.app
                assert app.kv is not None and app.gemini.cache is not None and app.load_share is not None
                assert [t.name for t in app.load_share.transports if t.name == "nats"] == ["nats"]
                async with asyncio.timeout(10):
                    await app.kv.ready.wait()
                    while not app.load_share.transports[-1].connected:
                        await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)  # time for any other connection to show up
                state = await connz(monitor)
                assert state["num_connections"] == 1, [c.get("name") for c in state["connections"]]
                assert state["connections"][0]["name"] == "continuum-ingress"
                assert app.gemini.cache is not None
            async with asyncio.timeout(5):  # closed with the app
                while (await connz(monitor))["num_connections"]:
                    await asyncio.sleep(0.05)
    finally:
        await server.close()
