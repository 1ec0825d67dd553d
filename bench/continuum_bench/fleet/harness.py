"""The router harness of `bench compare`: the registry of router factories, the `FleetContext`
each factory gets, and the child-process plumbing they share.

A router factory is an async context manager that starts a router against the fleet described
by a `FleetContext` and yields its base URL (`http://host:port`; the benchmark appends `/v1`),
or a list of base URLs when it runs several ingress replicas (the driver then spreads the
requests over them round-robin, as a load balancer would). `continuum_bench.compare` re-exports these
names, so plugins keep importing them from there.

A factory whose front process (the one clients talk to) can be restarted on its own wraps it in
`front(ctx, start)`: `--restart-router-at` then stops that process and starts it again mid-run,
as an operator restarting the router's container would, while everything behind it (engines,
the bus, the KV listener) keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from continuum_bench.fleet.runner import FleetBenchOptions
from continuum_bench.fleet.tokens import HfTokenizerFiles
from continuum_common.procs import free_port, stop_process
from continuum_sim import EngineEndpoints

RouterUrls = str | list[str]
RouterFactory = Callable[["FleetContext"], AbstractAsyncContextManager[RouterUrls]]
ROUTERS: dict[str, RouterFactory] = {}
READY_TIMEOUT_S = 60.0


def router(name: str) -> Callable[[RouterFactory], RouterFactory]:
    """Register a router factory under `name` (see the module docstring)."""

    def register(factory: RouterFactory) -> RouterFactory:
        ROUTERS[name] = factory
        return factory

    return register


def router_urls(value: RouterUrls) -> list[str]:
    """A factory's yield as a non-empty list of base URLs."""
    urls = [value] if isinstance(value, str) else list(value)
    if not urls:
        raise ValueError("a router factory yielded no URL")
    return urls


@dataclass
class FleetContext:
    """What a router factory may use: the engines as the router should see them (`endpoints`;
    their HTTP URLs point at the call-counting tap when `--count-engine-calls` is on), a
    private directory for configs and logs, the run's options, and the Hugging Face tokenizer
    files the engines run with (`--tokenizer hf`, else None)."""

    endpoints: list[EngineEndpoints]
    work_dir: Path
    options: FleetBenchOptions
    hf_tokenizer: HfTokenizerFiles | None = None
    # The workload being run (set by `bench compare` before each run): names the files a router
    # leaves per run, such as its saved /metrics.
    run: str = ""
    # The restartable front processes running now, by their current base URL (`front`).
    fronts: dict[str, Front] = field(default_factory=dict)
    _logs: list[Path] = field(default_factory=list)

    @property
    def model(self) -> str:
        model: str = self.endpoints[0].model
        return model

    @property
    def block_size(self) -> int:
        size: int = self.endpoints[0].block_size
        return size

    @property
    def hash_seed(self) -> str:
        """The engines' PYTHONHASHSEED (vLLM's NONE_HASH seed), needed to recompute their hashes."""
        seeds = {e.python_hash_seed for e in self.endpoints}
        if len(seeds) != 1:
            raise ValueError(f"the engines use different python_hash_seed values: {sorted(seeds)}")
        return seeds.pop()

    def log(self, name: str) -> Path:
        path = self.work_dir / f"{name}.log"
        self._logs.append(path)
        return path

    @staticmethod
    def free_port() -> int:
        return free_port()

    def write_yaml(self, name: str, data: dict[str, Any]) -> Path:
        path = self.work_dir / name
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path


class Front:
    """A router's front process, restartable in place: `start()` runs it and yields its base
    URL (a new one after a restart when the process binds a free port)."""

    def __init__(self, start: Callable[[], AbstractAsyncContextManager[str]]) -> None:
        self._start = start
        self._running: AbstractAsyncContextManager[str] | None = None

    async def open(self) -> str:
        running = self._start()
        url = await running.__aenter__()
        self._running = running
        return url

    async def close(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            await running.__aexit__(None, None, None)

    async def restart(self) -> str:
        """Stop the process (SIGTERM, as a container stop sends) and start it again."""
        await self.close()
        return await self.open()


@contextlib.asynccontextmanager
async def front(ctx: FleetContext, start: Callable[[], AbstractAsyncContextManager[str]]) -> AsyncIterator[str]:
    """Run a restartable front process (see the module docstring); yields its first URL."""
    proc = Front(start)
    try:
        url = await proc.open()
        ctx.fronts[url] = proc
        yield url
    finally:
        ctx.fronts = {u: f for u, f in ctx.fronts.items() if f is not proc}
        await proc.close()


async def restart_fronts(ctx: FleetContext, urls: Sequence[str]) -> list[str]:
    """Restart the front processes serving `urls`, one after the other; returns the URLs the
    clients should use now. A router none of whose URLs has a restartable front cannot be
    restarted: RuntimeError (a run that claims a restart has one)."""
    if not any(url in ctx.fronts for url in urls):
        raise RuntimeError(f"no restartable front process serves {', '.join(urls)} (see harness.front)")
    out = []
    for url in urls:
        proc = ctx.fronts.pop(url, None)
        if proc is None:
            out.append(url)
            continue
        new = await proc.restart()
        ctx.fronts[new] = proc
        out.append(new)
    return out


@contextlib.asynccontextmanager
async def process(
    argv: Sequence[str], log_path: Path, *, ready: str | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[asyncio.subprocess.Process, re.Match[str] | None]]:
    """Run `argv` with stdout+stderr appended to `log_path`; with `ready`, wait for a line
    matching it (and yield the match). SIGTERM on exit, SIGKILL 15 s later."""
    log = log_path.open("ab")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    match: re.Match[str] | None = None
    pump: asyncio.Task[None] | None = None
    try:
        if ready is not None:
            async with asyncio.timeout(READY_TIMEOUT_S):
                while match is None:
                    line = await proc.stdout.readline()
                    if not line:
                        raise RuntimeError(f"{argv[0]} exited before it was ready; see {log_path}")
                    log.write(line)
                    match = re.search(ready, line.decode(errors="replace"))
        pump = asyncio.create_task(_pump(proc.stdout, log))
        yield proc, match
    finally:
        await stop_process(proc, signal.SIGTERM, grace=15)
        if pump is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pump, 5)
        log.close()


async def _pump(stream: asyncio.StreamReader, log: Any) -> None:
    while line := await stream.readline():
        log.write(line)
        log.flush()


def console(name: str) -> list[str]:
    """A console script of this installation (the same interpreter's bin directory)."""
    candidate = Path(sys.executable).with_name(name)
    return [str(candidate)] if candidate.exists() else [name]


async def wait_until(
    check: Callable[[], Any], what: str, limit_s: float = READY_TIMEOUT_S, every_s: float = 0.2
) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError):
            if await check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(every_s)
