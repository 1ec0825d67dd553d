"""`continuum-router up --topology multi`: the scaled-out topology as local processes, for a
machine without Docker (the same shape as deploy/compose).

`up` keeps what it always starts (the embedded nats-server, `--demo`'s engines) and adds, each
as a process of its own: a redis-server (unless the configuration names a Redis), the KV
listener (with a listener file or `--demo`), two indexers on one durable consumer (with the KV
index on), gemini-cache (when enabled) and the router as one `serve` with `server.workers =
--replicas`: N ingress processes on one port, sharing one load view (and, with KV routing, each
a replica on NATS). The configuration they run is derived from the given one and written to
`.continuum/multi/`: the bus points at `up`'s NATS, the KV index and the response cache move
to the shared Redis (a memory backend would give each replica its own), the port is `up`'s.

Each child is started bound to `up` (continuum_common.children: it dies with `up`) and recorded
in the state lock; SIGHUP is passed to the router, which reloads every replica.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from continuum_common.config import read_yaml
from continuum_common.procs import HttpServiceProcess, ManagedProcess, RedisServer, free_port
from continuum_router.statelock import StateLock

log = logging.getLogger("continuum.up")

INDEXERS = 2


@dataclass
class MultiPlan:
    """What to start, derived from the configuration (pure; `plan()` builds it)."""

    router: dict[str, Any]
    listener: dict[str, Any] | None
    own_redis: bool
    indexers: int
    gemini_cache: bool
    replicas: int
    files: dict[str, Path] = field(default_factory=dict)


def plan(
    router: dict[str, Any],
    *,
    nats_url: str,
    port: int,
    host: str,
    replicas: int,
    listener: dict[str, Any] | None,
) -> MultiPlan:
    """The multi-process configuration: `router` (the file's data) pointed at `nats_url`, with
    the KV index and response cache on Redis and `replicas` workers on `host:port`."""
    data = dict(router)
    bus = dict(data.get("bus") or {})
    if bus.get("embedded", True):
        bus.update({"embedded": False, "url": nats_url})
    data["bus"] = bus
    data["server"] = {**(data.get("server") or {}), "host": host, "port": port, "workers": replicas}
    kv = dict(data.get("kv_cache_index") or {})
    kv_on = bool(kv.get("enabled"))
    if kv_on:
        kv["backend"] = "redis"
        data["kv_cache_index"] = kv
    cache = dict(data.get("response_cache") or {})
    if cache.get("enabled") and cache.get("backend", "memory") == "memory":
        cache["backend"] = "redis"
        data["response_cache"] = cache
    own_redis = (kv_on or bool(cache.get("enabled"))) and not data.get("redis") and not cache.get("redis")
    if listener is not None:
        listener = {**listener, "bus": {**(listener.get("bus") or {}), "embedded": False, "url": nats_url}}
    gemini = bool((data.get("gemini_context_cache") or {}).get("enabled"))
    return MultiPlan(data, listener, own_redis, INDEXERS if kv_on else 0, gemini, replicas)


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@contextlib.asynccontextmanager
async def _child(
    process: ManagedProcess, lock: StateLock, name: str, described: dict[str, str], what: str
) -> AsyncIterator[ManagedProcess]:
    await process.start()
    lock.add_child(name, process.pid)
    described[name] = what
    log.info("%s: %s", name, what)
    try:
        yield process
    finally:
        await process.stop(grace=10)


async def run_multi(
    stack: contextlib.AsyncExitStack,
    multi: MultiPlan,
    *,
    state_dir: Path,
    lock: StateLock,
    reloaders: list[Callable[[], object]],
) -> dict[str, str]:
    """Start every process of `multi` (stopped by `stack`, in reverse); returns name -> what it
    is, the router's URL under "ingress"."""
    work = state_dir / "multi"
    work.mkdir(parents=True, exist_ok=True)
    described: dict[str, str] = {}
    router = multi.router
    if multi.own_redis:
        redis = RedisServer(work / "redis")
        await stack.enter_async_context(_child(redis, lock, "redis", described, "redis-server (no persistence)"))
        router["redis"] = {"url": redis.url}
    router_file = _write(work / "router.yaml", router)
    level = ("--log-level", "INFO")
    if multi.listener is not None:
        port = free_port()
        multi.listener["listen"] = f"127.0.0.1:{port}"
        listener_file = _write(work / "listener.yaml", multi.listener)
        listener = HttpServiceProcess(
            "listener", _python("continuum_listener", "--config", str(listener_file), *level),
            f"http://127.0.0.1:{port}/healthz", work, port,
        )  # fmt: skip
        sources = len(multi.listener.get("sources") or [])
        await stack.enter_async_context(_child(listener, lock, "listener", described, f"{sources} source(s)"))
    for i in range(multi.indexers):
        port = free_port()
        indexer = HttpServiceProcess(
            f"indexer-{i}",
            _python("continuum_indexer", "--config", str(router_file), "--listen", f"127.0.0.1:{port}", *level),
            f"http://127.0.0.1:{port}/healthz", work, port,
        )  # fmt: skip
        await stack.enter_async_context(_child(indexer, lock, f"indexer-{i}", described, "JetStream -> Redis KV index"))
    if multi.gemini_cache:
        port = free_port()
        gemini = HttpServiceProcess(
            "gemini-cache",
            _python("continuum_gemini_cache", "--config", str(router_file), "--http-port", str(port), *level),
            f"http://127.0.0.1:{port}/healthz", work, port,
        )  # fmt: skip
        await stack.enter_async_context(_child(gemini, lock, "gemini-cache", described, "Gemini cachedContents"))
    server = router["server"]
    url = f"http://{server['host']}:{server['port']}"
    ingress = HttpServiceProcess(
        "ingress", _python("continuum_router", "serve", "--config", str(router_file), *level),
        f"{url}/healthz", work, int(server["port"]),
    )  # fmt: skip
    await stack.enter_async_context(_child(ingress, lock, "ingress", described, url))
    reloaders.append(lambda: ingress.signal(signal.SIGHUP))
    described["ingress"] = url
    return described


def load_plan_inputs(config_path: Path, listener_path: Path | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The router file's data and the listener file's (None without one)."""
    return read_yaml(config_path), (read_yaml(listener_path) if listener_path is not None else None)


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
