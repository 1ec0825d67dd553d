"""Plumbing shared by the peer-router plugins: finding the binary, waiting for the workers,
keeping the router's own metrics after a run."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

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
