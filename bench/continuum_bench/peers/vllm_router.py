"""vllm-router (PyPI `vllm-router`, the Rust router of vllm-project/router) as a peer in
`bench compare`: `vllm-router-cache-aware` and `vllm-router-kv-aware` (docs/peer-routers.md).

* `cache_aware`: the router's approximate radix tree over request text per worker; no engine
  input besides the HTTP traffic it forwards.
* `kv_aware`: the router subscribes to every engine's ZMQ KV-event PUB (`--kv-event-source
  WORKER_URL=tcp://...`, plus the replay ROUTER with `--kv-event-replay-source`) and keeps a
  block index; for each request it asks the engine's vLLM `/tokenize` route for the prompt's
  token ids and routes by the longest cached prefix per worker, with a load term.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any, Literal

from continuum_bench.compare import FleetContext, front, router
from continuum_bench.peers.common import peer_binary, running_peer, same_urls
from continuum_sim import EngineEndpoints

Policy = Literal["cache_aware", "kv_aware"]
VLLM_EVENT_ERAS = ("map", "array")  # vLLM's wire formats; "sglang" is not one


def kv_event_sources(endpoints: Sequence[EngineEndpoints]) -> tuple[list[str], list[str], int]:
    """`--kv-event-source` and `--kv-event-replay-source` values (WORKER_URL=ENDPOINT) and the
    fleet's block size, or ValueError when the fleet cannot feed kv_aware."""
    sources: list[str] = []
    replays: list[str] = []
    block_sizes = {e.block_size for e in endpoints}
    if len(block_sizes) != 1:
        raise ValueError(f"kv_aware takes one --kv-event-block-size; the engines use {sorted(block_sizes)}")
    for e in endpoints:
        if not e.kv_events_endpoint:
            raise ValueError(f"engine {e.name} publishes no KV events")
        if e.zmq_mode != "bind":
            raise ValueError(f"engine {e.name}: the router's SUB connects, so the engine's PUB must bind")
        if e.era not in VLLM_EVENT_ERAS:
            raise ValueError(f"engine {e.name}: KV-event era {e.era!r} is not vLLM's wire format")
        url = e.url.rstrip("/")
        sources.append(f"{url}={e.kv_events_endpoint}")
        if e.replay_endpoint:
            replays.append(f"{url}={e.replay_endpoint}")
    return sources, replays, block_sizes.pop()


def vllm_router_argv(
    binary: Sequence[str],
    endpoints: Sequence[EngineEndpoints],
    *,
    policy: Policy,
    port: int,
    prometheus_port: int,
    host: str = "127.0.0.1",
    log_level: str = "info",
) -> list[str]:
    """The command line of one vllm-router against `endpoints`. Policy knobs stay at the
    router's defaults (cache_threshold 0.3, balance thresholds 64 / 1.5; kv_aware temperature
    0, no session affinity)."""
    if not endpoints:
        raise ValueError("no engines")
    argv = [
        *binary,
        "--host", host, "--port", str(port),
        "--prometheus-host", host, "--prometheus-port", str(prometheus_port),
        "--log-level", log_level,
        "--policy", policy,
        "--worker-urls", *[e.url.rstrip("/") for e in endpoints],
    ]  # fmt: skip
    if policy == "kv_aware":
        sources, replays, block_size = kv_event_sources(endpoints)
        for value in sources:
            argv += ["--kv-event-source", value]
        for value in replays:
            argv += ["--kv-event-replay-source", value]
        argv += ["--kv-event-block-size", str(block_size), "--kv-event-model", endpoints[0].model]
    return argv


def workers_ready(listing: Any, expected: Sequence[str]) -> bool:
    """`GET /list_workers` answers {"urls": [...]} once the router has admitted its workers."""
    urls = listing.get("urls") if isinstance(listing, dict) else None
    return isinstance(urls, list) and same_urls([str(u) for u in urls], expected)


@contextlib.asynccontextmanager
async def vllm_router(ctx: FleetContext, name: str, policy: Policy) -> AsyncIterator[str]:
    port, metrics_port = ctx.free_port(), ctx.free_port()
    argv = vllm_router_argv(
        peer_binary("vllm-router"), ctx.endpoints, policy=policy, port=port, prometheus_port=metrics_port
    )
    # A restartable front (`--restart-router-at`): the same ports after a restart.
    start = partial(
        running_peer,
        ctx, name, argv, port=port, metrics_port=metrics_port,
        workers_path="/list_workers", workers_ready=workers_ready, what=f"vllm-router ({policy})",
    )  # fmt: skip
    async with front(ctx, start) as base:
        yield base


@router("vllm-router-cache-aware")
@contextlib.asynccontextmanager
async def vllm_router_cache_aware(ctx: FleetContext) -> AsyncIterator[str]:
    async with vllm_router(ctx, "vllm-router-cache-aware", "cache_aware") as url:
        yield url


@router("vllm-router-kv-aware")
@contextlib.asynccontextmanager
async def vllm_router_kv_aware(ctx: FleetContext) -> AsyncIterator[str]:
    async with vllm_router(ctx, "vllm-router-kv-aware", "kv_aware") as url:
        yield url
