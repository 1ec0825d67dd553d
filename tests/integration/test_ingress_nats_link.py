"""An ingress process holds one NATS connection, whatever uses the bus in it: KV routing (its
embedded index's feed, indexer admin, routing decisions), the load reports between replicas
and the Gemini context cache's client. Counted by the real nats-server's monitoring endpoint.
That connection is not sent back what it publishes itself (its decisions and load reports are
for the other replicas; an echo would only wake it to be skipped); what other connections
publish still arrives."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.msg import Msg

from continuum_common.config.router import Bus
from continuum_common.procs import NatsServer, free_port
from continuum_ingress.adapters.nats_link import NatsLink
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


async def test_own_messages_are_not_echoed_others_arrive(nats_server: NatsServer) -> None:
    link = NatsLink(Bus(embedded=False, url=nats_server.url))
    await link.start()
    other = await nats.connect(nats_server.url)
    try:
        assert link.is_connected
        got: list[bytes] = []

        async def received(msg: Msg) -> None:
            got.append(msg.data)

        await link.nc.subscribe("continuum.test.echo", cb=received)
        await link.nc.flush()
        await link.nc.publish("continuum.test.echo", b"own")
        await other.publish("continuum.test.echo", b"other")
        await other.flush()
        await link.nc.flush()
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the own message, were it echoed, would be here by now
        assert got == [b"other"]
    finally:
        await other.close()
        await link.aclose()
