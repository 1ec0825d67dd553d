"""The whole Tier 4 path for tests, with real parts: simulated vLLM engines (HTTP + ZMQ KV
events) → KV listener → nats-server JetStream → indexer → Redis (or the ingress's embedded
memory index) → the ingress and its KV scorer. Everything runs in the test's event loop except
the servers the fixtures start."""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from continuum_common.config.listener import ListenerConfig
from continuum_common.hashing import request_prefix_key
from continuum_common.kvindex import KvIndex
from continuum_common.kvindex.adapters.redis_index import RedisKvIndex
from continuum_common.procs import NatsServer, RedisServer
from continuum_common.redis_client import make_redis
from continuum_common.salt import make_salt
from continuum_indexer.app import IndexerApp
from continuum_listener.app import ListenerApp, running
from continuum_listener.config import settings_from
from continuum_sim import EngineConfig, SimFleet
from continuum_testing.indexer_harness import running as running_indexer
from continuum_testing.indexer_harness import settings as indexer_settings
from continuum_testing.ingress_harness import RunningIngress, router_config, running_ingress

SECRET = "kv-e2e-secret"
SECRET_ENV = "CONTINUUM_KV_E2E_SALT"
MODEL = "continuum-sim-8b"


def words(tag: str, count: int) -> str:
    """Text distinct per `tag`, one token per word with the simulator's tokenizer (its
    vocabulary holds every 3-letter lowercase string, with and without a leading space)."""
    start = zlib.crc32(tag.encode())
    out = []
    for i in range(count):
        n = (start + i * 7919) % 17576
        out.append(chr(97 + n // 676) + chr(97 + n // 26 % 26) + chr(97 + n % 26))
    return " ".join(out)


def chat(system: str | None, user: str, max_tokens: int = 4) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}


def key_of(body: dict[str, Any]) -> str:
    key = request_prefix_key(body, enabled=True)
    assert key is not None
    return key.hex()


@dataclass
class KvStack:
    fleet: SimFleet
    listener: ListenerApp
    ingress: RunningIngress
    index: KvIndex  # what the ingress reads (a separate reader for redis)
    http: httpx.AsyncClient

    def url(self, engine: int) -> str:
        return self.fleet.urls[engine]

    def name(self, engine: int) -> str:
        name: str = self.fleet.endpoints[engine].name
        return name

    async def direct(self, engine: int, body: dict[str, Any], *, salted: bool = True) -> None:
        """Send a request straight to an engine, salted as the ingress would salt it there."""
        if salted:
            key = request_prefix_key(body, enabled=True)
            assert key is not None
            body = {**body, "cache_salt": make_salt(SECRET.encode(), self.name(engine), key)}
        response = await self.http.post(self.url(engine) + "/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text

    async def via_ingress(self, body: dict[str, Any]) -> str:
        response = await self.http.post(self.ingress.url + "/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.headers["x-continuum-backend"]

    async def holders(self, prefix: str) -> dict[str, int]:
        rows = (await self.index.query_many([prefix]))[prefix]
        return {h.backend: h.token_count for h in rows}

    async def wait_holders(
        self, prefix: str, check: Callable[[dict[str, int]], bool], timeout: float = 10.0
    ) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while True:
            found = await self.holders(prefix)
            if check(found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"index for {prefix[:12]} never matched; last: {found}")
            await asyncio.sleep(0.02)

    def decisions(self, decision: str) -> int:
        registry = self.ingress.app.metrics.registry
        return int(
            sum(
                registry.get_sample_value(
                    "continuum_kv_index_routing_decisions_total", {"decision": decision, "tier": t}
                )
                or 0
                for t in ("gpu_hot", "storage_warm", "none")
            )
        )


def ingress_config(
    fleet: SimFleet,
    nats: NatsServer,
    redis: RedisServer | None,
    *,
    bus: dict[str, Any] | None = None,
    redis_options: dict[str, Any] | None = None,
    backend_options: dict[str, Any] | None = None,
    **kv: Any,
) -> dict[str, Any]:
    backends = [{**b, "health_check_interval_ms": 200, **(backend_options or {})} for b in fleet.router_backends()]
    data: dict[str, Any] = {
        "backends": backends,
        "selection_strategy": "RoundRobin",
        "prefix_routing": {"enabled": True},
        "bus": {"embedded": False, "url": nats.url, **(bus or {})},
        "kv_cache_index": {
            "enabled": True,
            "backend": "redis" if redis is not None else "memory",
            "salt_echo": {"enabled": True, "secret_env": SECRET_ENV},
            # the seed's scorer on the prefix-key index, fed by the listener's prefix events
            "default_mode": "prefix_key",
            "scoring": {"model": "seed"},
            **kv,
        },
    }
    if redis is not None:
        data["redis"] = {"url": redis.url, **(redis_options or {})}
    return data


@contextlib.asynccontextmanager
async def kv_stack(
    nats: NatsServer,
    redis: RedisServer | None,
    monkeypatch: Any,
    *,
    engines: int = 3,
    engine: EngineConfig | None = None,
    bus: dict[str, Any] | None = None,
    redis_options: dict[str, Any] | None = None,
    backend_options: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    **kv: Any,
) -> AsyncIterator[KvStack]:
    """`bus` and `redis_options` add connection fields (TLS, credentials) to the `bus` of every
    service and to the `redis` section, `backend_options` fields to every backend; `extra`
    adds top-level sections to the router file."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    async with contextlib.AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(SimFleet(engines, config=engine, time_scale=0.001))
        sources = fleet.listener_sources()
        for source in sources:
            source["prefix_key_mode"] = "salt_echo"
            source["publish"] = "prefix"  # this stack exercises the prefix-key index
            source.pop("detokenize_endpoint", None)
        listener_cfg = ListenerConfig.model_validate(
            {
                "listen": "127.0.0.1:0",
                "bus": {"embedded": False, "url": nats.url, **(bus or {})},
                "salt": {"secret_env": SECRET_ENV},
                "limits": {"coalesce_window_ms": 10},
                "sources": sources,
            }
        )
        listener = await stack.enter_async_context(running(settings_from(listener_cfg)))
        await _wait(lambda: all(p.stats.connected for p in listener.pipelines.values()), "engines connected")
        options = {"bus": bus, "redis_options": redis_options, "backend_options": backend_options}
        cfg = {**ingress_config(fleet, nats, redis, **options, **kv), **(extra or {})}
        index: KvIndex
        if redis is not None:
            indexer = IndexerApp(indexer_settings(router_config(cfg)))
            await stack.enter_async_context(running_indexer(indexer))
            client = make_redis(router_config(cfg).redis_connection())  # type: ignore[arg-type]
            stack.push_async_callback(client.aclose)
            index = RedisKvIndex.from_config(router_config(cfg).kv_cache_index, client)
        ingress = await stack.enter_async_context(running_ingress(cfg))
        kv_routing = ingress.app.kv
        assert kv_routing is not None
        async with asyncio.timeout(15):
            await kv_routing.ready.wait()
        if redis is None:
            assert kv_routing.embedded is not None
            index = kv_routing.embedded.index
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        yield KvStack(fleet, listener, ingress, index, http)


async def _wait(check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
