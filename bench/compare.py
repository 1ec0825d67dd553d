"""Routers side by side on one simulated fleet (`continuum-router bench compare`, also
`python -m bench.compare`).

One fleet of simulated vLLM engines is started (a child process); then, for each workload and
each router, the router is started against that fleet, the fleet benchmark (bench/fleet) drives
the workload through it over real HTTP (engines' prefix caches reset before every run), and the
router is stopped. The summary table (hit rate as a fraction of the ideal, TTFT percentiles,
load imbalance) is printed and written to bench/results/compare-<workloads>.{md,json}.

Built-in routers (each a real process tree, nothing in the benchmark's own event loop):

| name | what runs |
|---|---|
| `continuum-round-robin` | `continuum-router serve`, RoundRobin, prefix routing off |
| `continuum-prefix-hash` | `continuum-router serve`, PrefixAwareHash (CHWBL, Tier 1) |
| `continuum-prefix-hash-kv` | PrefixAwareHash + KV index (Tier 4, memory index in the ingress), salt echo, a `continuum-kv-listener` on the engines' ZMQ events, a private `nats-server -js` |
| `continuum-prefix-hash-kv-redis` | the same with `backend: redis`: a `redis-server` and a `continuum-indexer` |
| `direct-round-robin`, `direct-prefix-hash` | no router: the benchmark's own baselines |

Adding a router: write an async context manager that starts it against the fleet described by
a `FleetContext` and yields its base URL (`http://host:port`, the benchmark appends `/v1`), and
register it under a name:

    from bench.compare import FleetContext, router

    @router("vllm-router-cache-aware")
    @contextlib.asynccontextmanager
    async def vllm_router(ctx: FleetContext) -> AsyncIterator[str]:
        ...  # ctx.endpoints (EngineEndpoints: .url, .kv_events_endpoint, .model, ...),
        ...  # ctx.work_dir (a private directory for configs and logs), ctx.free_port()
        async with process([...], ctx.log("vllm-router"), ready=r"listening") as proc:
            yield f"http://127.0.0.1:{port}"

Put it in a module and pass `--plugin your.module` (repeatable), then name it in `--routers`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import re
import secrets
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.fleet.report import markdown_row
from bench.fleet.runner import FleetBenchOptions, engine_configs, report_and_print, run_fleet_bench
from continuum_common.procs import NatsServer, RedisServer, free_port
from continuum_sim import EngineEndpoints, SimFleet, listener_sources, router_backends

RouterFactory = Callable[["FleetContext"], AbstractAsyncContextManager[str]]
ROUTERS: dict[str, RouterFactory] = {}
DEFAULT_ROUTERS = ("continuum-round-robin", "continuum-prefix-hash", "continuum-prefix-hash-kv")
DEFAULT_WORKLOADS = ("shared-prompt", "multi-turn")
READY_TIMEOUT_S = 60.0


def router(name: str) -> Callable[[RouterFactory], RouterFactory]:
    """Register a router factory under `name` (see the module docstring)."""

    def register(factory: RouterFactory) -> RouterFactory:
        ROUTERS[name] = factory
        return factory

    return register


@dataclass
class FleetContext:
    endpoints: list[EngineEndpoints]
    work_dir: Path
    options: FleetBenchOptions
    _logs: list[Path] = field(default_factory=list)

    @property
    def model(self) -> str:
        model: str = self.endpoints[0].model
        return model

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


# ---- process plumbing --------------------------------------------------------------------


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
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
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


async def wait_until(check: Callable[[], Any], what: str, limit_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError):
            if await check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


# ---- Continuum -----------------------------------------------------------------------------


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
    path = ctx.write_yaml(f"{name}.yaml", config)
    argv = [*console("continuum-router"), "serve", "--config", str(path), "--port", "0", "--log-level", "WARNING"]
    async with process(argv, ctx.log(name), ready=r"listening on (http://\S+)") as (_, match):
        assert match is not None
        yield match.group(1)


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


@contextlib.asynccontextmanager
async def kv_stack(ctx: FleetContext, backend: str) -> AsyncIterator[str]:
    """nats-server, the KV listener, (Redis + indexer,) and the ingress with the KV index."""
    salt = ctx.work_dir / "salt-secret"
    salt.write_text(secrets.token_urlsafe(32))
    async with contextlib.AsyncExitStack() as stack:
        nats = NatsServer(data_dir=ctx.work_dir / f"nats-{backend}")
        await nats.start()
        stack.push_async_callback(nats.close)
        listener = ctx.write_yaml(
            f"listener-{backend}.yaml",
            {
                "listen": "127.0.0.1:0",
                "bus": {"embedded": False, "url": nats.url},
                "salt": {"secret_file": str(salt)},
                "sources": [{**s, "prefix_key_mode": "auto"} for s in listener_sources(ctx.endpoints)],
            },
        )
        await stack.enter_async_context(
            process([*console("continuum-kv-listener"), "--config", str(listener)], ctx.log(f"listener-{backend}"))
        )
        config = continuum_config(ctx, "PrefixAwareHash", prefix_routing=True)
        config["bus"] = {"embedded": False, "url": nats.url}
        config["kv_cache_index"] = {
            "enabled": True,
            "backend": backend,
            "salt_echo": {"enabled": True, "secret_file": str(salt)},
        }
        if backend == "redis":
            redis = RedisServer(data_dir=ctx.work_dir / "redis")
            await redis.start()
            stack.push_async_callback(redis.close)
            config["redis"] = {"url": redis.url}
            path = ctx.write_yaml("indexer.yaml", config)
            argv = [*console("continuum-indexer"), "--config", str(path), "--nats-url", nats.url, "--listen", "off"]
            await stack.enter_async_context(process(argv, ctx.log("indexer")))
        url = await stack.enter_async_context(continuum_ingress(ctx, f"continuum-kv-{backend}", config))
        await _wait_kv_ready(url, backend)
        yield url


async def _wait_kv_ready(url: str, backend: str) -> None:
    """The ingress's consumer is bound (memory) and the listener has announced its epoch."""
    async with httpx.AsyncClient(timeout=5) as client:

        async def bound() -> bool:
            text = (await client.get(url + "/metrics")).text
            return backend != "memory" or 'continuum_kv_consumer_connected{backend="event_bus"} 1.0' in text

        await wait_until(bound, "the ingress's KV consumer")


@router("continuum-prefix-hash-kv")
@contextlib.asynccontextmanager
async def continuum_kv_memory(ctx: FleetContext) -> AsyncIterator[str]:
    async with kv_stack(ctx, "memory") as url:
        yield url


@router("continuum-prefix-hash-kv-redis")
@contextlib.asynccontextmanager
async def continuum_kv_redis(ctx: FleetContext) -> AsyncIterator[str]:
    async with kv_stack(ctx, "redis") as url:
        yield url


def _builtin(name: str) -> RouterFactory:
    @contextlib.asynccontextmanager
    async def baseline(ctx: FleetContext) -> AsyncIterator[str]:
        yield name

    return baseline


for _name in ("direct-round-robin", "direct-prefix-hash"):
    router(_name)(_builtin(_name))


# ---- the comparison ------------------------------------------------------------------------


async def compare(
    routers: Sequence[str], workloads: Sequence[str], base: FleetBenchOptions, work_dir: Path
) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    await asyncio.to_thread(work_dir.mkdir, parents=True, exist_ok=True)
    async with SimFleet(configs=engine_configs(base), process=not base.in_process) as fleet:
        info = work_dir / "fleet.json"
        fleet.write_info(info)
        ctx = FleetContext(list(fleet.endpoints), work_dir, base)
        for workload in workloads:
            for name in routers:
                print(f"== {workload} via {name}", file=sys.stderr, flush=True)
                async with ROUTERS[name](ctx) as url:
                    opts = replace(
                        base, workload=workload, router=url, router_label=name, fleet_file=str(info),
                        name=f"compare-{workload}-{name}",
                        command=f"{base.command} (workload {workload}, router {name})",
                    )  # fmt: skip
                    report, results = await run_fleet_bench(opts)
                    report_and_print(report, results, opts)
                    reports.append(report)
    return reports


MD_HEADER = (
    "| workload | router | requests | errors | hit rate | ideal | hit/ideal | TTFT p50 | TTFT p90 | TTFT p99 "
    "| E2E p50 | E2E p99 | req/s | out tok/s | imbalance req | imbalance tok |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
)


def table(reports: Sequence[dict[str, Any]]) -> str:
    rows = []
    for report in reports:
        # markdown_row starts with "| run | router | workload | engines | ..."; keep what we show.
        cells = markdown_row(report).strip().strip("|").split("|")
        workload, label = report["workload"]["workload"], report["router"]
        rows.append("| " + " | ".join([workload, label, *[c.strip() for c in cells[4:]]]) + " |")
    return MD_HEADER + "\n".join(rows) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="continuum-router bench compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--routers", default=",".join(DEFAULT_ROUTERS), help="comma-separated registered names")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help="shared-prompt, multi-turn, trace")
    p.add_argument("--plugin", action="append", default=[], help="module that registers more routers (repeatable)")
    p.add_argument("--list", action="store_true", help="list the registered routers and exit")
    p.add_argument("--work-dir", default=None, help="configs and logs of the routers (default: a new temp dir)")
    p.add_argument("--time-scale", type=float, default=1.0, help="real seconds per simulated second (default 1.0)")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--num-gpu-blocks", type=int, default=1500)
    p.add_argument("--requests", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out-dir", default="bench/results")
    p.add_argument("--in-process", action="store_true", help="engines in this process (default: a child process)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    for module in args.plugin:
        importlib.import_module(module)
    if args.list:
        print("\n".join(sorted(ROUTERS)))
        return 0
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown:
        print(f"error: unknown router(s) {', '.join(unknown)}; known: {', '.join(sorted(ROUTERS))}", file=sys.stderr)
        return 2
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    base = FleetBenchOptions(
        engines=args.engines, num_gpu_blocks=args.num_gpu_blocks, time_scale=args.time_scale, seed=args.seed,
        requests=args.requests, rate=args.rate, conversations=args.conversations, out_dir=args.out_dir,
        in_process=args.in_process, plot=False, progress=sys.stderr.isatty(),
        command="continuum-router bench compare " + shlex.join(argv),
    )  # fmt: skip
    import tempfile

    work_dir = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="continuum-compare-"))
    reports = asyncio.run(compare(routers, workloads, base, work_dir))
    text = table(reports)
    print("\n" + text)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "compare-" + "-".join(workloads)
    (out / f"{stem}.md").write_text(f"Command: `{base.command}`\n\n{text}", encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(reports, indent=2), encoding="utf-8")
    print(f"wrote {out / (stem + '.md')}, {out / (stem + '.json')}; router logs in {work_dir}")
    return 0 if all(r["results"]["ok"] == r["results"]["requests"] for r in reports) else 1


if __name__ == "__main__":
    # Run the importable module's main, not this `__main__` copy: plugins import `bench.compare`
    # and register their routers in that module's ROUTERS.
    from bench.compare import main as _main

    sys.exit(_main())
