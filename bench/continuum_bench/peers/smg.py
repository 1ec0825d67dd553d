"""smg (PyPI `smg`, the SGLang model gateway, lightseekorg/smg) as a peer in `bench compare`:
`smg-cache-aware` (docs/peer-routers.md), and `smg-cache-aware-beside-kv`, a diagnostic: smg
routes while Continuum's KV event pipeline (a nats-server, the KV listener and an ingress
consuming the events, `continuum-kv-precise`'s stack) runs beside it on the same cores, unused,
to measure what that pipeline's CPU costs a router's time to first token.

`cache_aware` keeps an approximate radix tree of the request text each worker has been sent
and picks the worker with the longest match when it covers at least `cache_threshold` of the
request, else the least-loaded worker; a load gate sends a request away from a matched worker
that is far busier than the fleet mean. It reads no KV events.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from continuum_bench.compare import FleetContext, front, router
from continuum_bench.fleet.continuum import KvStack, kv_stack
from continuum_bench.peers.common import peer_binary, running_peer, same_urls
from continuum_sim import EngineEndpoints


def smg_argv(
    binary: Sequence[str],
    endpoints: Sequence[EngineEndpoints],
    *,
    policy: str,
    port: int,
    prometheus_port: int,
    host: str = "127.0.0.1",
    log_level: str = "info",
) -> list[str]:
    """`smg launch` against `endpoints`; the policy's knobs stay at smg's defaults."""
    if not endpoints:
        raise ValueError("no engines")
    return [
        *binary, "launch",
        "--host", host, "--port", str(port),
        "--prometheus-host", host, "--prometheus-port", str(prometheus_port),
        "--log-level", log_level,
        "--policy", policy,
        "--worker-urls", *[e.url.rstrip("/") for e in endpoints],
    ]  # fmt: skip


def workers_ready(listing: Any, expected: Sequence[str]) -> bool:
    """smg registers workers in the background after it listens; `GET /workers` lists them.
    Ready when exactly the expected workers are there, healthy and in status "ready"."""
    workers = listing.get("workers") if isinstance(listing, dict) else None
    if not isinstance(workers, list):
        return False
    if not all(isinstance(w, dict) and w.get("is_healthy") is True and w.get("status") == "ready" for w in workers):
        return False
    return same_urls([str(w.get("url")) for w in workers], expected)


@contextlib.asynccontextmanager
async def smg(ctx: FleetContext, name: str, policy: str) -> AsyncIterator[str]:
    port, metrics_port = ctx.free_port(), ctx.free_port()
    argv = smg_argv(peer_binary("smg"), ctx.endpoints, policy=policy, port=port, prometheus_port=metrics_port)
    # A restartable front (`--restart-router-at`): the same ports after a restart.
    start = partial(
        running_peer,
        ctx, name, argv, port=port, metrics_port=metrics_port,
        workers_path="/workers", workers_ready=workers_ready, what=f"smg ({policy})",
    )  # fmt: skip
    async with front(ctx, start) as base:
        yield base


@router("smg-cache-aware")
@contextlib.asynccontextmanager
async def smg_cache_aware(ctx: FleetContext) -> AsyncIterator[str]:
    async with smg(ctx, "smg-cache-aware", "cache_aware") as url:
        yield url


@router("smg-cache-aware-beside-kv")
@contextlib.asynccontextmanager
async def smg_cache_aware_beside_kv(ctx: FleetContext) -> AsyncIterator[str]:
    async with (
        kv_stack(ctx, KvStack("continuum-kv-beside", "memory", "precise", "blocks")),
        smg(ctx, "smg-cache-aware-beside-kv", "cache_aware") as url,
    ):
        yield url
