"""Continuum's own routers for `bench compare`, each a real process tree against the fleet.

| name | what runs |
|---|---|
| `continuum-round-robin` | `continuum-router serve`, RoundRobin, prefix routing off |
| `continuum-prefix-hash` | `continuum-router serve`, PrefixAwareHash (CHWBL, Tier 1) |
| `continuum-prefix-hash-kv` | PrefixAwareHash + the KV index in its prefix-key form: prefix keys (`default_mode: prefix_key`, the composite scoring formula `scoring.model: seed`, salt echo), the listener publishing prefix-key events (`publish: prefix`), a private `nats-server -js`; memory index in the ingress |
| `continuum-prefix-hash-kv-redis` | the same with `backend: redis`: a `redis-server` and a `continuum-indexer` |
| `continuum-kv-approx` | PrefixAwareHash + block index, `default_mode: approximate` (chained hashes of text chunks), the listener publishing engine block hashes (`publish: blocks`); memory index |
| `continuum-kv-precise` | the same with one precise match group for the fleet: the engines' vLLM block hashes recomputed from the prompt's token ids (a local tokenizer with `--tokenizer hf`, else the engines' `/tokenize`) |
| `continuum-kv-precise-redis` | `continuum-kv-precise` with `backend: redis`, a `redis-server` and a `continuum-indexer` |
| `continuum-kv-approx-bare` | `continuum-kv-approx` without the features a single replica can do without: no answers read (`learn_answers: false`), no decisions or load shared over NATS (`share_decisions: false`, `load_sharing.enabled: false`); for measuring what they cost |
| `continuum-kv-precise-bare` | `continuum-kv-precise` without the same features (answers are read in approximate mode only, so here it means no decisions or load shared over NATS); for measuring what they cost |
| `continuum-kv-precise-x3`, `continuum-kv-approx-x3` | three `continuum-router serve` replicas sharing one NATS; the benchmark spreads requests over them |
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from continuum_bench.fleet.harness import FleetContext, console, front, process, router, wait_until
from continuum_common.procs import NatsServer, RedisServer
from continuum_sim import listener_sources, router_backends

Mode = Literal["prefix_key", "approximate", "precise"]
Publish = Literal["prefix", "blocks"]


def continuum_config(ctx: FleetContext, strategy: str, *, prefix_routing: bool) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "selection_strategy": strategy,
        "prefix_routing": {"enabled": prefix_routing},
        "backends": [
            {**b, "health_check_interval_ms": 2000, "request_timeout_ms": 600_000}
            for b in router_backends(ctx.endpoints)
        ],
    }


@contextlib.asynccontextmanager
async def continuum_ingress(ctx: FleetContext, name: str, config: dict[str, Any]) -> AsyncIterator[str]:
    """One `continuum-router serve` process, restartable on its own (`front`)."""
    path = ctx.write_yaml(f"{name}.yaml", config)
    starts = itertools.count()

    def start() -> contextlib.AbstractAsyncContextManager[str]:
        n = next(starts)
        return _ingress_process(ctx, name if n == 0 else f"{name}.restart{n}", path)

    async with front(ctx, start) as url:
        yield url


@contextlib.asynccontextmanager
async def _ingress_process(ctx: FleetContext, name: str, path: Path) -> AsyncIterator[str]:
    # `python -m continuum_router` is `continuum-router` of the code being measured, whichever
    # console scripts are installed.
    argv = [sys.executable, "-m", "continuum_router", "serve", "--config", str(path), "--port", "0"]
    argv += ["--log-level", "WARNING"]
    async with process(argv, ctx.log(name), ready=r"listening on (http://\S+)") as (_, match):
        assert match is not None
        url = match.group(1)
        try:
            await _until_ready(url)
            yield url
        finally:
            # the router's own view of the run (decisions, selection times) next to its log
            stem = f"{name}.{ctx.run}" if ctx.run else name
            await _save_metrics(url + "/metrics", ctx.work_dir / f"{stem}.metrics.txt")


async def _until_ready(url: str) -> None:
    """As a load balancer admits a replica: once `GET /readyz` says so (with KV routing on,
    once the KV index is fed and the route history replayed), as the peers' plugins wait for
    their workers."""
    async with httpx.AsyncClient(timeout=5) as client:

        async def ready() -> bool:
            return (await client.get(url + "/readyz")).status_code == 200

        await wait_until(ready, f"{url}/readyz", every_s=0.02)


async def _save_metrics(url: str, path: Path) -> None:
    with contextlib.suppress(httpx.HTTPError, OSError):
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(url)
        if response.status_code == 200:
            await asyncio.to_thread(path.write_text, response.text, encoding="utf-8")


@router("continuum-round-robin")
@contextlib.asynccontextmanager
async def continuum_round_robin(ctx: FleetContext) -> AsyncIterator[str]:
    async with continuum_ingress(ctx, "continuum-rr", continuum_config(ctx, "RoundRobin", prefix_routing=False)) as u:
        yield u


@router("continuum-prefix-hash")
@contextlib.asynccontextmanager
async def continuum_prefix_hash(ctx: FleetContext) -> AsyncIterator[str]:
    config = continuum_config(ctx, "PrefixAwareHash", prefix_routing=True)
    async with continuum_ingress(ctx, "continuum-ph", config) as url:
        yield url


@dataclass(frozen=True)
class KvStack:
    """One KV-index deployment: index backend, matching mode, what the listener publishes, and
    how many ingress replicas share the bus (and Redis)."""

    name: str  # stem of its configs and logs
    backend: Literal["memory", "redis"]
    mode: Mode
    publish: Publish
    replicas: int = 1
    # Overrides of `kv_cache_index.scoring.cost` (cost-model variants, e.g. from a --plugin).
    cost: tuple[tuple[str, float | bool], ...] = ()
    # The shared load view between replicas (kv_cache_index.load_sharing.enabled).
    load_sharing: bool = True
    # Overrides of the precise match group (e.g. tokenize_memory_blocks).
    group: tuple[tuple[str, int | str], ...] = ()
    # Overrides of top-level `kv_cache_index` switches (e.g. learn_answers).
    index: tuple[tuple[str, bool], ...] = ()


def match_group(ctx: FleetContext) -> dict[str, Any]:
    """The fleet as one precise match group: the engines' vLLM hashing (block size, the
    PYTHONHASHSEED behind NONE_HASH) and, with `--tokenizer hf`, the same tokenizer files the
    engines run (without them the ingress asks the engines' /tokenize)."""
    group: dict[str, Any] = {
        "name": "fleet", "models": [ctx.model], "mode": "precise", "engine": "vllm",
        "block_size": ctx.block_size, "hash_seed": ctx.hash_seed,
    }  # fmt: skip
    if ctx.hf_tokenizer is not None:
        group["tokenizer"] = str(ctx.hf_tokenizer.tokenizer)
        group["chat_template"] = str(ctx.hf_tokenizer.chat_template)
    return group


def kv_index_config(ctx: FleetContext, stack: KvStack, salt_file: str) -> dict[str, Any]:
    index: dict[str, Any] = {"enabled": True, "backend": stack.backend}
    if stack.mode == "prefix_key":
        # The prefix-key form of the KV index: one prefix key per system prompt, the composite scoring formula, and
        # salt echo so the listener can map chains to prefix keys without detokenizing.
        index["default_mode"] = "prefix_key"
        index["scoring"] = {"model": "seed"}
        index["salt_echo"] = {"enabled": True, "secret_file": salt_file}
    elif stack.mode == "approximate":
        index["default_mode"] = "approximate"
    else:
        index["groups"] = [{**match_group(ctx), **dict(stack.group)}]
    if stack.cost:
        index["scoring"] = {"model": "cost", "cost": dict(stack.cost)}
    if not stack.load_sharing:
        index["load_sharing"] = {"enabled": False}
    index.update(stack.index)
    return index


def listener_config(ctx: FleetContext, stack: KvStack, nats_url: str, salt_file: str) -> dict[str, Any]:
    sources = []
    for source in listener_sources(ctx.endpoints):
        source["publish"] = stack.publish
        if stack.publish == "prefix":
            source["prefix_key_mode"] = "auto"
        sources.append(source)
    return {
        "listen": "127.0.0.1:0",
        "bus": {"embedded": False, "url": nats_url},
        "salt": {"secret_file": salt_file},
        "sources": sources,
    }


def bus_dir(ctx: FleetContext, stack: KvStack) -> Path:
    """The stack's JetStream store, one per run: each run starts as a fresh deployment, as the
    peers do, and not with the KV stream and route history of the workload before it (a
    restart within a run keeps the bus, as a restarted ingress container does)."""
    return ctx.work_dir / (f"nats-{stack.name}-{ctx.run}" if ctx.run else f"nats-{stack.name}")


@contextlib.asynccontextmanager
async def kv_stack(ctx: FleetContext, stack: KvStack) -> AsyncIterator[list[str]]:
    """nats-server, the KV listener, (Redis + indexer,) and the ingress replica(s) with the KV
    index; yields the replicas' base URLs once every one has bound its bus consumer."""
    salt = ctx.work_dir / "salt-secret"
    salt.write_text(secrets.token_urlsafe(32))
    async with contextlib.AsyncExitStack() as exits:
        nats = NatsServer(data_dir=bus_dir(ctx, stack))
        await nats.start()
        exits.push_async_callback(nats.close)
        listener = ctx.write_yaml(f"listener-{stack.name}.yaml", listener_config(ctx, stack, nats.url, str(salt)))
        argv = [*console("continuum-kv-listener"), "--config", str(listener)]
        helpers = [
            await exits.enter_async_context(process(argv, ctx.log(f"listener-{stack.name}"), ready=r"listening on \S+"))
        ]
        config = continuum_config(ctx, "PrefixAwareHash", prefix_routing=True)
        config["bus"] = {"embedded": False, "url": nats.url}
        config["kv_cache_index"] = kv_index_config(ctx, stack, str(salt))
        if stack.backend == "redis":
            redis = RedisServer(data_dir=ctx.work_dir / f"redis-{stack.name}")
            await redis.start()
            exits.push_async_callback(redis.close)
            config["redis"] = {"url": redis.url}
            path = ctx.write_yaml(f"indexer-{stack.name}.yaml", config)
            argv = [*console("continuum-indexer"), "--config", str(path), "--nats-url", nats.url, "--listen", "off"]
            helpers.append(await exits.enter_async_context(process(argv, ctx.log(f"indexer-{stack.name}"))))
        urls = []
        for replica in range(stack.replicas):
            name = stack.name if stack.replicas == 1 else f"{stack.name}-{replica}"
            urls.append(await exits.enter_async_context(continuum_ingress(ctx, name, config)))
        for url in urls:
            await _wait_kv_ready(url, stack.backend)
        for proc, _ in helpers:  # a helper that rejected its config has exited by now
            if proc.returncode is not None:
                raise RuntimeError(f"a helper of {stack.name} exited with {proc.returncode}; see {ctx.work_dir}")
        yield urls


async def _wait_kv_ready(url: str, backend: str) -> None:
    """The ingress's bus consumer is bound (memory index; the indexer feeds Redis)."""
    async with httpx.AsyncClient(timeout=5) as client:

        async def bound() -> bool:
            text = (await client.get(url + "/metrics")).text
            return backend != "memory" or 'continuum_kv_consumer_connected{backend="event_bus"} 1.0' in text

        await wait_until(bound, f"the KV consumer of the ingress at {url}")


STACKS = (
    ("continuum-prefix-hash-kv", KvStack("continuum-kv-memory", "memory", "prefix_key", "prefix")),
    ("continuum-prefix-hash-kv-redis", KvStack("continuum-kv-redis", "redis", "prefix_key", "prefix")),
    ("continuum-kv-approx", KvStack("continuum-kv-approx", "memory", "approximate", "blocks")),
    (
        "continuum-kv-approx-bare",
        KvStack(
            "continuum-kv-approx-bare",
            "memory",
            "approximate",
            "blocks",
            load_sharing=False,
            index=(("learn_answers", False), ("share_decisions", False)),
        ),
    ),
    ("continuum-kv-precise", KvStack("continuum-kv-precise", "memory", "precise", "blocks")),
    ("continuum-kv-precise-redis", KvStack("continuum-kv-precise-redis", "redis", "precise", "blocks")),
    (
        "continuum-kv-precise-bare",
        KvStack(
            "continuum-kv-precise-bare",
            "memory",
            "precise",
            "blocks",
            load_sharing=False,
            index=(("learn_answers", False), ("share_decisions", False)),
        ),
    ),
    ("continuum-kv-precise-x3", KvStack("continuum-kv-precise-x3", "memory", "precise", "blocks", replicas=3)),
    ("continuum-kv-approx-x3", KvStack("continuum-kv-approx-x3", "memory", "approximate", "blocks", replicas=3)),
)


def register_stack(name: str, stack: KvStack) -> None:
    @router(name)
    @contextlib.asynccontextmanager
    async def factory(ctx: FleetContext) -> AsyncIterator[str | list[str]]:
        async with kv_stack(ctx, stack) as urls:
            yield urls[0] if len(urls) == 1 else urls


for _name, _stack in STACKS:
    register_stack(_name, _stack)


def _builtin(name: str) -> Any:
    @contextlib.asynccontextmanager
    async def baseline(ctx: FleetContext) -> AsyncIterator[str]:
        yield name

    return baseline


for _name in ("direct-round-robin", "direct-prefix-hash"):
    router(_name)(_builtin(_name))
