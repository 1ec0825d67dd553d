"""The shared load view between ingress replicas over a real nats-server: one replica's
in-flight requests and queued prefill tokens show up in the other's pool within a report
interval, a stopping replica's load is dropped at once, a silent one's at the staleness bound,
and bad reports are counted and dropped while the view keeps working."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import nats
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from continuum_common.config import Backend
from continuum_common.procs import NatsServer
from continuum_common.wire.loads import SUBJECT_PREFIX, BackendLoad, LoadReport, encode_load_report
from continuum_ingress.adapters.load_nats import NatsLoadTransport
from continuum_ingress.load_share import LoadShare
from continuum_ingress.pool import BackendPool
from continuum_testing.ingress_harness import running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs
from tests.integration.test_kv_selector_ingress import ingresses, kv_config, sample

BACKENDS = ("ls-a", "ls-b")


class Replica:
    def __init__(self, nc: NatsClient, name: str, stale_after_s: float) -> None:
        self.pool = BackendPool()
        self.pool.sync([Backend(name=b, url=f"http://127.0.0.1:1/{b}", models=["m"]) for b in BACKENDS])
        self.registry = CollectorRegistry()
        self.nc = nc
        self.share = LoadShare(
            name,
            self.pool,
            [NatsLoadTransport(nc, name)],
            interval_s=0.05,
            stale_after_s=stale_after_s,
            registry=self.registry,
        )

    def state(self, backend: str) -> tuple[int, int]:
        s = self.pool.get(backend)
        assert s is not None
        return s.remote_in_flight, s.remote_queued_tokens

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def replicas(url: str, *names: str, stale_after_s: float = 0.5) -> AsyncIterator[list[Replica]]:
    async with AsyncExitStack() as stack:
        out = []
        tasks = []
        for name in names:
            nc = await nats.connect(url)
            stack.push_async_callback(nc.close)
            r = Replica(nc, name, stale_after_s)
            out.append(r)
            tasks.append(asyncio.create_task(r.share.run()))
        try:
            yield out
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_one_replicas_load_reaches_the_other(nats_server: NatsServer) -> None:
    async with replicas(nats_server.url, "rep-1", "rep-2") as (one, two):
        a = one.pool.get("ls-a")
        assert a is not None
        a.begin(0.0)
        a.begin(0.0)
        a.queue_prefill(4096)
        await eventually(lambda: two.state("ls-a") == (2, 4096))
        two_a = two.pool.get("ls-a")
        assert two_a is not None
        assert two_a.in_flight == 2 and two_a.local_in_flight == 0  # the bound sees both replicas
        assert one.state("ls-a") == (0, 0)  # its own report is not counted twice
        a.prefill_done(4096)
        a.finish()
        await eventually(lambda: two.state("ls-a") == (1, 0))
        assert two.sample("continuum_ingress_load_peers") == 1
        assert one.sample("continuum_ingress_load_reports_total", direction="sent") > 0


async def test_a_stopping_replica_is_dropped_at_once_and_a_silent_one_at_the_bound(
    nats_server: NatsServer,
) -> None:
    async with replicas(nats_server.url, "rep-3", "rep-4", "rep-5", stale_after_s=2.0) as (three, four, five):
        for r in (three, four):
            s = r.pool.get("ls-b")
            assert s is not None
            s.begin(0.0)
        await eventually(lambda: five.state("ls-b") == (2, 0))
        await three.share.stop()  # final report
        await eventually(lambda: five.state("ls-b")[0] <= 1, timeout=1.0)  # well inside the 2 s bound
        # four goes silent without a final report (a crash): its load counts until the bound
        loop = asyncio.get_running_loop()
        started = loop.time()
        await four.nc.close()
        await eventually(lambda: five.state("ls-b")[0] == 0, timeout=6.0)
        assert loop.time() - started >= 1.5
        assert five.sample("continuum_ingress_load_peers_expired_total") >= 1


async def test_bad_and_reordered_reports_are_counted_and_dropped(nats_server: NatsServer) -> None:
    async with replicas(nats_server.url, "rep-6") as (six,):
        nc = await nats.connect(nats_server.url)
        try:
            await nc.publish(SUBJECT_PREFIX + "intruder", b"\x00not msgpack")
            newer = LoadReport("other", 10, 50, [BackendLoad("ls-a", 3, 0)])
            older = LoadReport("other", 9, 50, [BackendLoad("ls-a", 99, 0)])
            await nc.publish(SUBJECT_PREFIX + "other", encode_load_report(newer))
            await nc.publish(SUBJECT_PREFIX + "other", encode_load_report(older))
            await nc.flush()
            await eventually(
                lambda: six.sample("continuum_ingress_load_reports_dropped_total", reason="reordered") == 1
            )
            assert six.sample("continuum_ingress_load_reports_dropped_total", reason="decode") == 1
            assert six.state("ls-a") == (3, 0)
            # the view keeps working after both
            await nc.publish(SUBJECT_PREFIX + "other", encode_load_report(LoadReport("other", 11, 50, [])))
            await nc.flush()
            await eventually(lambda: six.state("ls-a") == (0, 0))
        finally:
            await nc.close()


async def test_ingress_replicas_bound_on_the_shared_load(nats_server: NatsServer, tmp_path: Path) -> None:
    """Two real ingress apps: requests held open on replica a count in replica b's pool (and in
    /admin/backends), and are gone from it once they finish."""
    async with running_stubs("a", "b") as stubs, AsyncExitStack() as stack:
        for s in stubs:
            s.stub.hold = asyncio.Event()
        token = tmp_path / "admin-token"
        token.write_text("t0ken")
        cfg = {**kv_config(stubs, nats_server.url), "admin": {"token_file": str(token)}}
        async with ingresses(cfg, 2) as [(ing_a, a), (ing_b, b)]:
            body = {"model": "m", "messages": [{"role": "user", "content": "hold me"}]}
            held = [asyncio.create_task(a.post("/v1/chat/completions", json=body)) for _ in range(3)]
            stack.callback(lambda: [t.cancel() for t in held])
            await eventually(lambda: sum(s.in_flight for s in ing_a.app.pool.states()) == 3)
            await eventually(lambda: sum(s.remote_in_flight for s in ing_b.app.pool.states()) == 3)
            assert sample(ing_b, "continuum_ingress_load_peers") == 1
            r = await b.get("/admin/backends", headers={"authorization": "Bearer t0ken"})
            assert r.status_code == 200, r.text
            listed = {x["name"]: x for x in r.json()["backends"]}
            assert sum(x["other_replicas_in_flight_requests"] for x in listed.values()) == 3
            assert sum(x["in_flight_requests"] for x in listed.values()) == 0
            for s in stubs:
                assert s.stub.hold is not None
                s.stub.hold.set()
            replies = await asyncio.gather(*held)
            assert all(r.status_code == 200 for r in replies)
            await eventually(lambda: sum(s.remote_in_flight for s in ing_b.app.pool.states()) == 0)


async def test_load_sharing_can_be_turned_off(nats_server: NatsServer) -> None:
    async with running_stubs("a", "b") as stubs:
        cfg = kv_config(stubs, nats_server.url, load_sharing={"enabled": False})
        async with ingresses(cfg, 2) as [(ing_a, _), (ing_b, _)]:
            assert ing_a.app.kv is not None and ing_a.app.kv.load_share is None and ing_a.app.load_share is None
            await asyncio.sleep(0.3)
            assert sample(ing_b, "continuum_ingress_load_reports_total", direction="received") == 0


async def test_replicas_share_load_over_nats_without_kv_routing(nats_server: NatsServer) -> None:
    """`load_sharing.bus: always`: two plain ingress apps (no KV routing) each open a NATS
    connection of their own for the load view; a plain one (`auto`) has no view at all."""
    async with running_stubs("a", "b") as stubs, AsyncExitStack() as stack:
        for s in stubs:
            s.stub.hold = asyncio.Event()
        base = {
            "backends": stub_backends(stubs),
            "selection_strategy": "PrefixAwareHash",
            "prefix_routing": {"enabled": True},
            "bus": {"embedded": False, "url": nats_server.url},
        }
        plain = await stack.enter_async_context(running_ingress(base))
        assert plain.app.kv is None and plain.app.load_share is None
        cfg = {**base, "load_sharing": {"bus": "always", "interval_ms": 20, "stale_after_ms": 1000}}
        ing_a = await stack.enter_async_context(running_ingress(cfg))
        ing_b = await stack.enter_async_context(running_ingress(cfg))
        assert ing_a.app.kv is None and ing_a.app.load_share is not None
        a = await stack.enter_async_context(httpx.AsyncClient(base_url=ing_a.url, timeout=10))
        body = {"model": "m", "messages": [{"role": "user", "content": "hold me"}]}
        held = [asyncio.create_task(a.post("/v1/chat/completions", json=body)) for _ in range(2)]
        stack.callback(lambda: [t.cancel() for t in held])
        await eventually(lambda: sum(s.remote_in_flight for s in ing_b.app.pool.states()) == 2)
        assert sample(ing_b, "continuum_ingress_load_peers") == 1
        for s in stubs:
            assert s.stub.hold is not None
            s.stub.hold.set()
        assert all(r.status_code == 200 for r in await asyncio.gather(*held))
        await eventually(lambda: sum(s.remote_in_flight for s in ing_b.app.pool.states()) == 0)
