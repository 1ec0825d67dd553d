"""Plumbing shared by the peer-router plugins: finding the binary, waiting for the workers,
keeping the router's own metrics after a run."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from continuum_bench.compare import FleetContext, process

INSTALL_HINT = "pip install 'continuum-router[peers]'"


class PeerUnavailable(RuntimeError):
    """The peer router's console script is not installed."""


def peer_binary(name: str) -> list[str]:
    """The console script `name` from this interpreter's bin directory, else from PATH."""
    candidate = Path(sys.executable).with_name(name)
    if candidate.exists():
        return [str(candidate)]
    found = shutil.which(name)
    if found is None:
        raise PeerUnavailable(f"{name} is not installed; {INSTALL_HINT}")
    return [found]


def canonical_url(url: str) -> str:
    return url.rstrip("/")


def same_urls(seen: Sequence[str], expected: Sequence[str]) -> bool:
    """True when `seen` names exactly the `expected` worker URLs (order and trailing / ignored)."""
    return sorted(canonical_url(u) for u in seen) == sorted(canonical_url(u) for u in expected)


async def poll(check: Callable[[], Awaitable[bool]], what: str, *, limit_s: float = 60.0) -> None:
    """Call `check` every 0.2 s until it returns True; HTTP errors count as "not yet"."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError, TypeError):
            if await check():
                return
        if loop.time() > deadline:
            raise RuntimeError(f"timed out after {limit_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)


async def get_json(client: httpx.AsyncClient, url: str) -> Any:
    response = await client.get(url)
    response.raise_for_status()
    return response.json()


async def save_metrics(url: str, path: Path) -> None:
    """Keep the router's Prometheus page of the run (decision counters and the like) next to
    its log. Best effort: a router that already went away leaves no file."""
    with contextlib.suppress(httpx.HTTPError, OSError):
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(url)
        if response.status_code == 200:
            await asyncio.to_thread(path.write_text, response.text, encoding="utf-8")


def metrics_path(work_dir: Path, name: str) -> Path:
    """A new file per run: `<name>.metrics.<n>.txt` (a router runs once per workload)."""
    n = len(list(work_dir.glob(f"{name}.metrics.*.txt"))) + 1
    return work_dir / f"{name}.metrics.{n}.txt"


@contextlib.asynccontextmanager
async def running_peer(
    ctx: FleetContext,
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    metrics_port: int,
    workers_path: str,
    workers_ready: Callable[[Any, Sequence[str]], bool],
    what: str,
) -> AsyncIterator[str]:
    """Start a peer router, wait until `GET <workers_path>` shows it has admitted exactly the
    fleet's engines (listening is not enough: both peers register workers in the background),
    yield its base URL, and keep its Prometheus page of the run when it is stopped. Factories
    run it through `front(ctx, start)`, so `--restart-router-at` can restart it on the same ports."""
    base = f"http://127.0.0.1:{port}"
    expected = [e.url for e in ctx.endpoints]
    async with process(list(argv), ctx.log(name)) as (proc, _):
        async with httpx.AsyncClient(timeout=2) as client:

            async def ready() -> bool:
                if proc.returncode is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; see {ctx.work_dir / name}.log")
                return workers_ready(await get_json(client, base + workers_path), expected)

            await poll(ready, f"{what} to admit {len(expected)} workers")
        try:
            yield base
        finally:
            await save_metrics(f"http://127.0.0.1:{metrics_port}/metrics", metrics_path(ctx.work_dir, name))
