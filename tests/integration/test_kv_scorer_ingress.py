"""The KV scorer inside a real ingress (stub upstreams over loopback HTTP, real nats-server,
real redis-server, the indexer in-process): speculative entries, the admin endpoints in both
index modes, metrics exposure, and an index outage that must never fail a request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import nats
import orjson
import pytest
from nats.js.api import KeyValueConfig

from continuum_common.events import LISTENERS_BUCKET, EventType, KvEvent
from continuum_common.hashing import request_prefix_key
from continuum_common.kvindex import KvIndexError
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import NatsServer, RedisServer
from continuum_common.redis_client import make_redis
from continuum_indexer.app import IndexerApp
from continuum_testing.indexer_harness import ensure_stream, publish
from continuum_testing.indexer_harness import running as running_indexer
from continuum_testing.indexer_harness import settings as indexer_settings
from continuum_testing.ingress_harness import RunningIngress, router_config, running_ingress, stub_backends
from continuum_testing.upstream_stub import running_stubs

TOKEN = "kv-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def chat(system: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}


def key(system: str) -> str:
    k = request_prefix_key(chat(system), enabled=True)
    assert k is not None
    return k.hex()


def created(backend: str, prefix: str, tokens: int, seq: int) -> KvEvent:
    return KvEvent(backend, 1, seq, time.time(), EventType.CREATED, prefix, tokens)


def config(
    stubs: Any, nats_url: str, strategy: str = "RoundRobin", redis_url: str | None = None, **kv: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "backends": stub_backends(stubs),
        "selection_strategy": strategy,
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats_url, "request_timeout_ms": 500},
        "admin": {"token_env": "CONTINUUM_KV_TEST_ADMIN"},
        # the seed's scorer on the prefix-key index (the default is block matching and the cost model)
        "kv_cache_index": {
            "enabled": True,
            "backend": "redis" if redis_url else "memory",
            "default_mode": "prefix_key",
            "scoring": {"model": "seed"},
            **kv,
        },
    }
    if redis_url:
        data["redis"] = {"url": redis_url, "command_timeout_ms": 300, "connect_timeout_ms": 300}
    return data


@asynccontextmanager
async def ingress(cfg: dict[str, Any], monkeypatch: Any) -> AsyncIterator[tuple[RunningIngress, httpx.AsyncClient]]:
    monkeypatch.setenv("CONTINUUM_KV_TEST_ADMIN", TOKEN)
    async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10, verify=False) as c:
        assert ing.app.kv is not None
        async with asyncio.timeout(10):
            await ing.app.kv.ready.wait()
        yield ing, c


async def served_by(c: httpx.AsyncClient, system: str) -> str:
    r = await c.post("/v1/chat/completions", json=chat(system))
    assert r.status_code == 200, r.text
    return r.headers["x-continuum-backend"]


def sample(ing: RunningIngress, name: str, **labels: str) -> float:
    return ing.app.metrics.registry.get_sample_value(name, labels) or 0.0


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)


async def test_speculative_entry_makes_the_next_request_kv_aware(nats_server: NatsServer, monkeypatch: Any) -> None:
    async with running_stubs("a", "b", "c") as stubs:
        for ttl, expect in ((2000, "kv_aware"), (0, "fallback")):
            async with ingress(
                config(stubs, nats_server.url, "PrefixAwareHash", speculative_ttl_ms=ttl), monkeypatch
            ) as (ing, c):
                first = await served_by(c, "a brand new prompt")  # nobody holds it: the ring decides
                assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="fallback", tier="none") == 1
                assert await served_by(c, "a brand new prompt") == first
                tier = "gpu_hot" if expect == "kv_aware" else "none"
                assert sample(ing, "continuum_kv_index_routing_decisions_total", decision=expect, tier=tier) == (
                    1 if expect == "kv_aware" else 2
                )
                assert sample(ing, "continuum_kv_index_speculative_routes_total") == (1 if ttl else 0)


async def _heartbeat(nats_url: str, backend: str, *, connected: bool) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=LISTENERS_BUCKET, ttl=30, history=1))
        value = {"backend": backend, "listener": "test:1", "connected": connected, "events_received": 7,
                 "events_dropped": 1, "last_event_at": time.time(), "reconnects": 2, "source_epoch": 1, "ts": time.time()}  # fmt: skip
        await kv.put(backend, orjson.dumps(value))
    finally:
        await nc.close()


async def test_admin_endpoints_with_the_embedded_memory_index(nats_server: NatsServer, monkeypatch: Any) -> None:
    p1, p2 = key("prompt one"), key("prompt two")
    await ensure_stream(nats_server.url)
    await publish(nats_server.url, [created("b", p1, 2048, 1), created("c", p1, 512, 2), created("c", p2, 64, 3)])
    await _heartbeat(nats_server.url, "b", connected=True)
    async with running_stubs("a", "b", "c") as stubs, ingress(config(stubs, nats_server.url), monkeypatch) as (ing, c):
        embedded = ing.app.kv.embedded  # type: ignore[union-attr]
        assert embedded is not None
        await eventually(lambda: _held(embedded.index, p2))
        assert [await served_by(c, "prompt one") for _ in range(2)] == ["b", "b"]
        assert await served_by(c, "prompt three") in ("a", "b", "c")  # fallback
        assert (await c.get("/admin/kv-index/stats")).status_code == 401
        stats = (await c.get("/admin/kv-index/stats", headers=AUTH)).json()
        assert stats["enabled"] is True and stats["config"]["backend"] == "memory"
        scoring = stats["config"]["scoring"]
        assert {k: v for k, v in scoring.items() if k != "cost"} == {
            "model": "seed", "overlap_weight": 0.6, "load_weight": 0.3, "health_weight": 0.1,
            "min_overlap_threshold": 0.3, "gpu_tier_weight": 1.0, "storage_tier_weight": 0.6,
        }  # fmt: skip
        assert scoring["cost"]["affinity_threshold"] == 0.3 and stats["config"]["default_mode"] == "prefix_key"
        assert stats["index"] == {"prefix_count": 2, "entry_count": 3, "total_hits": 1, "total_evictions": 0}
        assert stats["routing_decisions"] == {"kv_aware": 2, "placed": 0, "fallback": 1, "total": 3}
        assert stats["overlap_score_count"] == 2 and stats["query_latency_count"] >= 2
        assert stats["index_source"] == "embedded"
        by_reporter = {(s["reporter"], s["backend_name"]): s for s in stats["event_sources"]}
        listener_b = by_reporter[("listener", "b")]
        assert (listener_b["connected"], listener_b["events_received"], listener_b["reconnect_count"]) == (True, 7, 2)
        bus = by_reporter[("indexer", "event_bus")]
        assert bus["connected"] is True and bus["events_received"] == 3
        backends = (await c.get("/admin/kv-index/backends", headers=AUTH)).json()
        rows = {r["backend_name"]: r for r in backends["backends"]}
        assert list(rows) == ["a", "b", "c"]
        assert rows["b"]["connection"]["source"] == "listener" and rows["b"]["connection"]["connected"] is True
        assert rows["a"]["connection"] is None
        assert rows["c"]["events"]["received"] == 2 and rows["c"]["events"]["index_created"] == 2
        assert rows["b"]["routing"] == {"kv_aware": 2}
        cleared = (await c.post("/admin/kv-index/clear", headers=AUTH)).json()
        assert cleared["success"] is True and cleared["entries_before_clear"] == 3 and cleared["cleared_entries"] == 2
        assert (await c.get("/admin/kv-index/stats", headers=AUTH)).json()["index"]["prefix_count"] == 0
        assert await served_by(c, "prompt one") in ("a", "b", "c")
        assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="fallback", tier="none") == 2
        metrics = (await c.get("/metrics")).text
        for name in ("continuum_kv_event_dropped_total", "continuum_kv_consumer_connected",
                     "continuum_kv_index_routing_decisions_total", "continuum_kv_index_overlap_score",
                     "continuum_kv_index_query_duration_seconds"):  # fmt: skip
            assert metrics.count(f"# TYPE {name} ") == 1, name
        assert 'continuum_kv_consumer_connected{backend="event_bus"} 1.0' in metrics


async def _held(index: Any, prefix: str) -> bool:
    return bool((await index.query_many([prefix]))[prefix])


async def test_admin_endpoints_with_the_indexer_and_redis(
    nats_server: NatsServer, redis_server: RedisServer, monkeypatch: Any
) -> None:
    p1 = key("prompt one")
    async with running_stubs("a", "b", "c") as stubs:
        cfg = config(stubs, nats_server.url, redis_url=redis_server.url)
        indexer = IndexerApp(indexer_settings(router_config(cfg)))
        async with ingress(cfg, monkeypatch) as (ing, c):
            async with running_indexer(indexer):
                await publish(nats_server.url, [created("b", p1, 100, 1), created("c", p1, 90, 2)])
                await eventually(lambda: _held(ing.app.kv.redis_index, p1))  # type: ignore[union-attr]
                assert await served_by(c, "prompt one") == "b"
                stats = (await c.get("/admin/kv-index/stats", headers=AUTH)).json()
                assert stats["index_source"] == "indexer" and stats["indexer"]["replica"]
                assert stats["index"]["prefix_count"] == 1 and stats["index"]["entry_count"] == 2
                assert stats["routing_decisions"]["kv_aware"] == 1
                assert {s["backend_name"] for s in stats["event_sources"]} == {"event_bus"}
                rows = {
                    r["backend_name"]: r
                    for r in (await c.get("/admin/kv-index/backends", headers=AUTH)).json()["backends"]
                }
                assert rows["b"]["events"]["applied"] == 1 and rows["b"]["routing"]["kv_aware"] == 1
                cleared = (await c.post("/admin/kv-index/clear", headers=AUTH)).json()
                assert cleared["success"] is True and cleared["cleared_entries"] == 1
                assert not await _held(ing.app.kv.redis_index, p1)  # type: ignore[union-attr]
                await publish(nats_server.url, [created("c", p1, 90, 3)])
                await eventually(lambda: _held(ing.app.kv.redis_index, p1))  # type: ignore[union-attr]
            # The indexer is gone: stats read the Redis index directly; clear refuses.
            stats = (await c.get("/admin/kv-index/stats", headers=AUTH)).json()
            assert stats["index_source"] == "unavailable" and stats["index"]["prefix_count"] == 1
            r = await c.post("/admin/kv-index/clear", headers=AUTH)
            assert r.status_code == 503 and r.json()["error"]["type"] == "indexer_unavailable"


async def test_an_index_outage_falls_back_without_failing_requests(
    nats_server: NatsServer, fresh_redis_server: RedisServer, monkeypatch: Any
) -> None:
    p1 = key("prompt one")
    redis = fresh_redis_server
    async with running_stubs("a", "b") as stubs:
        cfg = config(stubs, nats_server.url, redis_url=redis.url, speculative_ttl_ms=0)
        writer_client = make_redis(router_config(cfg).redis_connection())  # type: ignore[arg-type]
        writer = RedisKvIndex.from_config(router_config(cfg).kv_cache_index, writer_client)
        await writer.apply_batch([created("b", p1, 100, 1)])
        try:
            async with ingress(cfg, monkeypatch) as (ing, c):
                assert await served_by(c, "prompt one") == "b"
                await redis.stop()
                await asyncio.sleep(0.15)  # past the scorer's 100 ms cache
                picked = [await served_by(c, "prompt one") for _ in range(4)]
                assert sorted(picked) == ["a", "a", "b", "b"]  # RoundRobin: the scorer is out
                assert sample(ing, "continuum_kv_scorer_errors_total") == 4
                assert sample(ing, "continuum_kv_index_query_errors_total") >= 1
                await redis.start()
                for attempt in range(3):  # the writer's pooled connection died with the server
                    try:
                        await writer.apply_batch([created("b", p1, 100, 2)])
                        break
                    except KvIndexError:
                        assert attempt < 2
                # Once Redis answers again (after the back-off) the scorer routes by the index.
                await eventually(lambda: _served_by_b(c))
                assert [await served_by(c, "prompt one") for _ in range(3)] == ["b", "b", "b"]
        finally:
            await writer_client.aclose()


async def _served_by_b(c: httpx.AsyncClient) -> bool:
    return await served_by(c, "prompt one") == "b" and await served_by(c, "prompt one") == "b"


pytestmark = pytest.mark.timeout(120)


async def test_without_nats_the_ingress_serves_by_strategy_and_stops_promptly(monkeypatch: Any) -> None:
    from continuum_common.procs import free_port

    async with running_stubs("a", "b") as stubs:
        cfg = config(stubs, f"nats://127.0.0.1:{free_port()}")  # nothing listens there
        monkeypatch.setenv("CONTINUUM_KV_TEST_ADMIN", TOKEN)
        started = time.monotonic()
        async with running_ingress(cfg) as ing, httpx.AsyncClient(base_url=ing.url, timeout=10) as c:
            assert ing.app.kv is not None and not ing.app.kv.ready.is_set()
            assert sorted([await served_by(c, "prompt one") for _ in range(2)]) == ["a", "b"]
            assert sample(ing, "continuum_kv_index_routing_decisions_total", decision="fallback", tier="none") == 2
            stats = (await c.get("/admin/kv-index/stats", headers=AUTH)).json()
            sources = [(s["reporter"], s["backend_name"], s["connected"]) for s in stats["event_sources"]]
            assert sources == [("indexer", "event_bus", False)]  # no heartbeats readable; consumer not bound
        assert time.monotonic() - started < 5  # shutdown does not wait for a connection


async def test_the_redis_index_shares_the_process_redis_client_and_follows_a_swap(
    nats_server: NatsServer, redis_server: RedisServer, monkeypatch: Any
) -> None:
    p1 = key("prompt one")
    async with running_stubs("a", "b") as stubs:
        cfg = config(stubs, nats_server.url, redis_url=redis_server.url, speculative_ttl_ms=0)
        writer_client = make_redis(router_config(cfg).redis_connection())  # type: ignore[arg-type]
        try:
            await RedisKvIndex.from_config(router_config(cfg).kv_cache_index, writer_client).apply_batch(
                [created("b", p1, 100, 1)]
            )
            async with ingress(cfg, monkeypatch) as (ing, c):
                kv = ing.app.kv
                assert kv is not None and kv.redis_index is not None
                assert kv.redis_index._redis is ing.app.redis.client  # one pool for cache and KV index
                assert await served_by(c, "prompt one") == "b"
                before = ing.app.redis.client
                ing.app.redis.reload(router_config({**cfg, "redis": {**cfg["redis"], "pool_size": 4}}))
                assert ing.app.redis.client is not before
                assert kv.redis_index._redis is ing.app.redis.client and kv.prefix_scorer.index is kv.redis_index
                await asyncio.sleep(0.15)  # past the scorer's cache: the next read uses the new client
                assert [await served_by(c, "prompt one") for _ in range(2)] == ["b", "b"]
        finally:
            await writer_client.aclose()
