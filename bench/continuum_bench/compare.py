"""Routers side by side on one simulated fleet (`continuum-router bench compare`, also
`python -m continuum_bench.compare`).

One fleet of simulated vLLM engines is started (a child process); then, for each workload and
each router, the router is started against that fleet, the fleet benchmark (bench/continuum_bench/fleet) drives
the workload through it over real HTTP (engines' prefix caches reset before every run), and the
router is stopped. Before each router starts, the engines are made as fresh as a new fleet's
(`POST /sim/reset`: caches empty, KV event history forgotten), so a router's KV listener does
not replay the event history of the routers that ran before it. The summary table (hit rate
as a fraction of the ideal, TTFT percentiles, load imbalance) is printed and written to
bench/results/compare-<workloads>.{md,json}.

Workloads: `shared-prompt`, `multi-turn`, `trace` (a Mooncake JSONL, `--trace PATH`) and
`conversations` (production-shaped multi-turn chat, bench/continuum_bench/fleet/conversations.py). With
`--tokenizer hf` the engines and the workloads share a small trained Hugging Face tokenizer.
`--count-engine-calls` puts a counting tap in front of every engine and reports the calls each
router makes per routed request (`/tokenize`, health checks, metrics polls, ...).
`--request-log` also writes every run's requests, one JSON line each, in send order
(`compare-<workload>-<router>.requests.jsonl`: the backend chosen when the router names it,
cached and ideal tokens, TTFT), so two runs can be compared request by request.

Built-in routers (each a real process tree, nothing in the benchmark's own event loop) are
listed in bench/continuum_bench/fleet/continuum.py; `direct-round-robin` and `direct-prefix-hash` are the
benchmark's own baselines (no router). Name one beside the routers and the summary also gives
each router's own path over it: what the router itself added to the time to first token.

Adding a router: write an async context manager that starts it against the fleet described by
a `FleetContext` and yields its base URL (`http://host:port`, the benchmark appends `/v1`) —
or a list of base URLs for several replicas, which the benchmark takes in turn per request —
and register it under a name:

    from continuum_bench.compare import FleetContext, router

    @router("vllm-router-cache-aware")
    @contextlib.asynccontextmanager
    async def vllm_router(ctx: FleetContext) -> AsyncIterator[str]:
        ...  # ctx.endpoints (EngineEndpoints: .url, .kv_events_endpoint, .model, ...),
        ...  # ctx.work_dir (a private directory for configs and logs), ctx.free_port()
        async with process([...], ctx.log("vllm-router"), ready=r"listening") as proc:
            yield f"http://127.0.0.1:{port}"

Put it in a module and pass `--plugin your.module` (repeatable), then name it in `--routers`.

`--restart-router-at SECONDS` restarts each router's front process once during every run, as
an operator restarting its container would: new requests wait, the ones in flight finish, the
process gets SIGTERM and is started again (its engines, bus and KV listener keep running), and
the run goes on. The report then compares hits before and after the restart ("Router restarted
mid-run"). A factory takes part by starting its front process with `front(ctx, start)`; the
built-in routers and the peers do. Restarts happen one replica after another.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import shlex
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx

import continuum_bench.fleet.continuum  # noqa: F401  (registers Continuum's routers)
from continuum_bench.bytecode import compile_packages
from continuum_bench.fleet.cpu import cpu_snapshot, cpu_used
from continuum_bench.fleet.harness import (
    ROUTERS,
    FleetContext,
    RouterFactory,
    console,
    front,
    process,
    restart_fronts,
    router,
    router_urls,
    wait_until,
)
from continuum_bench.fleet.legs import legs_table
from continuum_bench.fleet.pinning import CpuSplit, kept_pinned, parse_cpus, split_cpus
from continuum_bench.fleet.report import REQUEST_LOG_HELP, markdown_row
from continuum_bench.fleet.responses_form import API_FORMS
from continuum_bench.fleet.router_timing import scrape_timing, timing_report, timing_table
from continuum_bench.fleet.runner import (
    WORKLOADS,
    FleetBenchOptions,
    engine_configs,
    fleet_process,
    report_and_print,
    run_fleet_bench,
)
from continuum_bench.fleet.scrape import fresh_all
from continuum_bench.fleet.tap import EngineTap
from continuum_bench.fleet.tokens import TOKENIZER_CHOICES, train_hf_tokenizer
from continuum_sim import SimFleet

__all__ = [
    "ROUTERS", "FleetContext", "RouterFactory", "compare", "console", "front", "main", "process", "router", "table",
    "wait_until",
]  # fmt: skip

DEFAULT_ROUTERS = ("continuum-round-robin", "continuum-prefix-hash", "continuum-prefix-hash-kv")
DEFAULT_WORKLOADS = ("shared-prompt", "multi-turn")


# ---- the comparison ------------------------------------------------------------------------


async def compare(
    routers: Sequence[str],
    workloads: Sequence[str],
    base: FleetBenchOptions,
    work_dir: Path,
    *,
    count_engine_calls: bool = False,
    failures: list[dict[str, str]] | None = None,
    router_cpus: frozenset[int] | None = None,
) -> list[dict[str, Any]]:
    """Run every workload through every router on one fleet. With `failures`, a run that
    fails is recorded there and the comparison goes on; without, the error propagates. With
    `router_cpus`, the router's processes run on those CPUs and the engines on the others."""
    if base.tokenizer == "hf" and base.hf_tokenizer is None:
        raise ValueError("--tokenizer hf: train the tokenizer first (continuum_bench.fleet.tokens.train_hf_tokenizer)")
    reports: list[dict[str, Any]] = []
    split = None if router_cpus is None else split_cpus(router_cpus, os.sched_getaffinity(0))
    await asyncio.to_thread(work_dir.mkdir, parents=True, exist_ok=True)
    async with SimFleet(configs=engine_configs(base), process=fleet_process(base)) as fleet:
        info = work_dir / "fleet.json"
        fleet.write_info(info)
        async with _tapped(fleet, count_engine_calls) as tap:
            endpoints = tap.endpoints if tap else list(fleet.endpoints)
            ctx = FleetContext(endpoints, work_dir, base, hf_tokenizer=base.hf_tokenizer)
            for workload in workloads:
                for name in routers:
                    try:
                        await _fresh(fleet)
                        reports.append(await _one_run(ctx, name, workload, info, tap, fleet.pids, split))
                    except (RuntimeError, OSError, ValueError, TimeoutError) as exc:
                        if failures is None:
                            raise
                        # A router that cannot start (or a run that breaks) is reported; the
                        # other routers still run on the same fleet.
                        print(f"!! {workload} via {name} failed: {exc}", file=sys.stderr, flush=True)
                        failures.append({"workload": workload, "router": name, "error": str(exc)[:300]})
    return reports


async def _fresh(fleet: SimFleet) -> None:
    """Every router starts on engines as fresh as a new fleet's: caches empty, and no event
    history of the runs before it for its KV listener to replay."""
    async with httpx.AsyncClient() as http:
        await fresh_all(http, [e.url for e in fleet.endpoints])


@contextlib.asynccontextmanager
async def _tapped(fleet: SimFleet, enabled: bool) -> AsyncIterator[EngineTap | None]:
    if not enabled:
        yield None
        return
    async with EngineTap(fleet.endpoints) as tap:
        yield tap


async def _one_run(
    ctx: FleetContext,
    name: str,
    workload: str,
    info: Path,
    tap: EngineTap | None,
    engine_pids: Sequence[int],
    split: CpuSplit | None = None,
) -> dict[str, Any]:
    base = ctx.options
    print(f"== {workload} via {name}", file=sys.stderr, flush=True)
    ctx.run = workload
    async with ROUTERS[name](ctx) as yielded, kept_pinned(os.getpid(), engine_pids, split):
        if base.restart_router_at is not None and not any(u in ctx.fronts for u in router_urls(yielded)):
            raise RuntimeError(f"{name} cannot be restarted mid-run: its factory does not start it with front()")
        opts = replace(
            base, workload=workload, router=",".join(router_urls(yielded)), router_label=name, fleet_file=str(info),
            name=f"compare-{workload}-{name}", command=f"{base.command} (workload {workload}, router {name})",
        )  # fmt: skip
        # What the router did while starting (and the readiness probe) is not per request.
        # Only process fleets let the engines' CPU be told from the router's.
        before = await cpu_snapshot(os.getpid()) if engine_pids else None
        # a restart starts the router's metrics again: no difference to take then
        timed = None if base.restart_router_at is not None else await scrape_timing(router_urls(yielded))
        report, results = await run_fleet_bench(
            opts, before_run=tap.reset if tap else None, on_interrupt=partial(restart_fronts, ctx)
        )
        if timed is not None and (after := await scrape_timing(router_urls(yielded))) is not None:
            # the ingress measures real seconds; the report's means are simulated ones
            scale = report.get("time_scale", 1.0)
            engine = report["results"].get("engine_ttft_s") or {}
            ttft, first = report["results"]["ttft_s"]["mean"], engine.get("engine_first_chunk_mean")
            report["router_timing"] = timing_report(
                after.minus(timed), None if ttft is None else ttft * scale, None if first is None else first * scale
            )
        if before is not None:
            used = cpu_used(before, await cpu_snapshot(os.getpid()), engine_pids)
            report["cpu_s"] = {
                "router": used.router_s,
                "engines": used.engines_s,
                "router_by_name": used.router_by_name,
            }
        if split is not None:
            report["cpus"] = {"router": sorted(split.router), "engines_and_client": sorted(split.rest)}
        if tap is not None:
            report["engine_calls"] = {
                "routed_requests": len(results), "by_route": tap.totals(), "by_engine": tap.counts(),
                "tap_errors": tap.errors,
            }  # fmt: skip
        report_and_print(report, results, opts)
    return report


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


def added_table(reports: Sequence[dict[str, Any]]) -> str:
    """Mean time to first token seen by the engines and by the client, and the difference:
    what each router added (its request path and the first chunk's way back). With engines
    that report it, also their front time (tokenizing before their clock starts) and the
    router's share without it.

    "Router's own" still holds what the benchmark's client and the engines' HTTP servers spend
    on every request, router or not; when a router-less baseline (`direct-*`) ran the same
    workload, the last column takes its figure out: what the router itself added."""
    baseline = _direct_own(reports)
    rows = []
    for report in reports:
        res = report["results"]
        engine = res.get("engine_ttft_s")
        if engine and res["ttft_s"]["mean"] is not None:
            front, net = engine.get("engine_front_mean"), engine.get("router_added_net_mean")
            first, own = engine.get("engine_first_chunk_mean"), engine.get("router_own_mean")
            base = baseline.get(report["workload"]["workload"])
            over = None if own is None or base is None else own - base
            rows.append(
                f"| {report['workload']['workload']} | {report['router']} | {engine['mean'] * 1000:.2f} | "
                f"{res['ttft_s']['mean'] * 1000:.2f} | {engine['router_added_mean'] * 1000:.2f} | "
                f"{_ms(front)} | {_ms(net)} | {_ms(first)} | {_ms(own)} | {_ms(over)} |"
            )
    if not rows:
        return ""
    head = (
        "| workload | router | engine TTFT mean (ms) | client TTFT mean (ms) | router added (ms) "
        "| engine front (ms) | router added, front taken out (ms) | engine first chunk (ms) | router's own (ms) "
        "| router's own over no router (ms) |\n"
    )
    return head + "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"


def _direct_own(reports: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per workload, the "router's own" time of the first router-less baseline that ran it."""
    out: dict[str, float] = {}
    for report in reports:
        engine = report["results"].get("engine_ttft_s") or {}
        own = engine.get("router_own_mean")
        workload = report["workload"]["workload"]
        if report["router"].startswith("direct-") and own is not None and workload not in out:
            out[workload] = own
    return out


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.2f}"


def cpu_table(reports: Sequence[dict[str, Any]]) -> str:
    """CPU seconds each run took from the shared cores: the router's processes (with its KV
    listener and bus, where it has them) and the engines, in all and per request."""
    rows = []
    for report in reports:
        cpu, requests = report.get("cpu_s"), report["results"]["requests"]
        if cpu and requests:
            names = sorted(cpu.get("router_by_name", {}).items(), key=lambda item: -item[1])
            parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in names if seconds >= 0.05)
            rows.append(
                f"| {report['workload']['workload']} | {report['router']} | {cpu['router']:.1f} | "
                f"{cpu['router'] / requests * 1000:.1f} | {parts or '–'} | {cpu['engines']:.1f} | "
                f"{cpu['engines'] / requests * 1000:.1f} |"
            )
    if not rows:
        return ""
    head = "| workload | router | router CPU (s) | per request (ms) | by process (s) | engines CPU (s) | per request (ms) |\n"
    return head + "|---|---|---:|---:|---|---:|---:|\n" + "\n".join(rows) + "\n"


def calls_table(reports: Sequence[dict[str, Any]], *, columns: int = 6) -> str:
    """Engine calls per routed request, one row per run, the busiest routes as columns."""
    counted = [r for r in reports if r.get("engine_calls")]
    if not counted:
        return ""
    totals: dict[str, int] = {}
    for report in counted:
        for route, count in report["engine_calls"]["by_route"].items():
            totals[route] = totals.get(route, 0) + count
    routes = sorted(totals, key=lambda r: -totals[r])[:columns]
    head = "| workload | router | requests | " + " | ".join(f"`{r}`" for r in routes) + " | other |\n"
    head += "|---|---|---:|" + "---:|" * (len(routes) + 1) + "\n"
    rows = []
    for report in counted:
        calls = report["engine_calls"]
        n = max(calls["routed_requests"], 1)
        by_route = calls["by_route"]
        other = sum(v for k, v in by_route.items() if k not in routes)
        cells = [f"{by_route.get(r, 0) / n:.2f}" for r in routes] + [f"{other / n:.2f}"]
        rows.append(
            f"| {report['workload']['workload']} | {report['router']} | {calls['routed_requests']} | "
            + " | ".join(cells)
            + " |"
        )
    return head + "\n".join(rows) + "\n"


def restart_table(reports: Sequence[dict[str, Any]]) -> str:
    rows = [r for r in reports if "restart" in r]
    if not rows:
        return ""
    head = (
        "| workload | router | restart at (s) | paused (s) | of which drain / restart (s) | hit/ideal before "
        "| hit/ideal after | first 30 s after | errors after | TTFT p90 after |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )

    def num(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    out = []
    for r in rows:
        x = r["restart"]
        out.append(
            f"| {r['workload']['workload']} | {r['router']} | {x['at_s']:.1f} | {x['downtime_s']:.2f} "
            f"| {num(x.get('drain_s'), 2)} / {num(x.get('restart_s'), 2)} | {num(x['before']['hit_rate_vs_ideal'], 4)} | {num(x['after']['hit_rate_vs_ideal'], 4)} "
            f"| {num(x['first_30s_after']['hit_rate_vs_ideal'], 4)} | {x['after']['errors']} "
            f"| {num(x['after']['ttft_p90_s'], 3)} |"
        )
    return head + "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    d = FleetBenchOptions()
    p = argparse.ArgumentParser(
        prog="continuum-router bench compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--routers", default=",".join(DEFAULT_ROUTERS), help="comma-separated registered names")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help=", ".join(WORKLOADS))
    p.add_argument("--plugin", action="append", default=[], help="module that registers more routers (repeatable)")
    p.add_argument("--list", action="store_true", help="list the registered routers and exit")
    p.add_argument("--work-dir", default=None, help="configs and logs of the routers (default: a new temp dir)")
    p.add_argument("--time-scale", type=float, default=1.0, help="real seconds per simulated second (default 1.0)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out-dir", default="bench/results")
    p.add_argument("--name", help="file stem of the summary (default compare-<workloads>)")
    p.add_argument(
        "--restart-router-at", type=float, metavar="SECONDS",
        help="restart the router's front process this many seconds into every run (hits before and after)",
    )  # fmt: skip
    p.add_argument("--request-log", action="store_true", help=REQUEST_LOG_HELP)
    p.add_argument(
        "--router-cpus", metavar="CPUS",
        help="run the router's processes on these CPUs only (e.g. 1, or 2-3) and the engines and the load generator "
        "on the others, as when the router has hosts of its own (Linux; default: all share every CPU)",
    )  # fmt: skip
    p.add_argument(
        "--count-engine-calls", action="store_true",
        help="count every HTTP call the router makes to the engines (a loopback tap in front of each engine)",
    )  # fmt: skip
    e = p.add_argument_group("engines")
    e.add_argument("--engines", type=int, default=4)
    e.add_argument("--num-gpu-blocks", type=int, default=1500, help="KV blocks per engine")
    e.add_argument("--block-size", type=int, default=d.block_size)
    e.add_argument("--max-model-len", type=int, default=d.max_model_len)
    e.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    e.add_argument(
        "--tokenizer", choices=TOKENIZER_CHOICES, default="builtin",
        help="hf: train a small Hugging Face tokenizer into the work dir once; engines, workloads, ideal and the "
        "precise match group all use it",
    )  # fmt: skip
    e.add_argument("--in-process", action="store_true", help="engines in this process (default: a child process)")
    e.add_argument(
        "--engine-processes", choices=("one", "each"), default="one",
        help="one: all engines in one child process (the default, as earlier runs); each: a process per engine, "
        "as real engines each have their own API server (a slow /tokenize on one no longer delays the others)",
    )  # fmt: skip
    w = p.add_argument_group("workloads")
    w.add_argument("--requests", type=int, help="shared-prompt: requests; trace: max lines")
    w.add_argument(
        "--rate", type=float, help="shared-prompt req/s; multi-turn and conversations: conversation starts/s"
    )
    w.add_argument("--output-tokens", type=int, help="answer length (shared-prompt, multi-turn)")
    w.add_argument("--conversations", type=int, default=64, help="multi-turn: conversations")
    w.add_argument("--system-prompts", type=int, help="multi-turn 4, conversations 4")
    w.add_argument("--duration", type=float, help="conversations: seconds of conversation starts (600)")
    w.add_argument(
        "--trace", help="trace: a Mooncake JSONL (default bench/continuum_bench/traces/mooncake_synthetic.jsonl)"
    )
    w.add_argument(
        "--trace-duration", type=float, help="trace: replay only the first N trace seconds (from --trace-start)"
    )
    w.add_argument(
        "--trace-start", type=float, default=0.0,
        help="trace: replay from this trace second on (a later window of a long trace; its first request comes at once)",
    )  # fmt: skip
    w.add_argument("--trace-limit", type=int, help="trace: replay only the first N lines")
    w.add_argument(
        "--api", dest="api_form", choices=API_FORMS, default="native",
        help="responses: send the chat workloads' requests (all but trace) to /v1/responses; "
        "responses-stored: the same, later turns as previous_response_id + the new messages",
    )  # fmt: skip
    return p


def options(args: argparse.Namespace, argv: Sequence[str]) -> FleetBenchOptions:
    return FleetBenchOptions(
        engines=args.engines, num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, tokenizer=args.tokenizer,
        time_scale=args.time_scale, seed=args.seed, requests=args.requests, rate=args.rate,
        output_tokens=args.output_tokens, conversations=args.conversations, system_prompts=args.system_prompts,
        duration=args.duration, trace=args.trace, trace_duration=args.trace_duration, trace_limit=args.trace_limit,
        trace_start=args.trace_start, out_dir=args.out_dir, in_process=args.in_process, engine_processes=args.engine_processes, plot=False, progress=sys.stderr.isatty(),
        api_form=args.api_form, restart_router_at=args.restart_router_at, request_log=args.request_log,
        command="continuum-router bench compare " + shlex.join(argv),
    )  # fmt: skip


def _check(args: argparse.Namespace, routers: Sequence[str], workloads: Sequence[str]) -> str | None:
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown:
        return f"unknown router(s) {', '.join(unknown)}; known: {', '.join(sorted(ROUTERS))}"
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not workloads:
        return f"unknown workload(s) {', '.join(bad)}; known: {', '.join(WORKLOADS)}"
    if args.engines < 1 or args.time_scale <= 0:
        return "--engines must be >= 1 and --time-scale > 0"
    if args.restart_router_at is not None and args.restart_router_at <= 0:
        return "--restart-router-at must be > 0"
    if args.trace_start < 0:
        return "--trace-start must be >= 0"
    if args.trace and not Path(args.trace).is_file():
        return f"--trace {args.trace}: no such file"
    if args.router_cpus is not None:
        try:
            split_cpus(parse_cpus(args.router_cpus), os.sched_getaffinity(0))
        except ValueError as exc:
            return str(exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    for module in args.plugin:
        importlib.import_module(module)
    if args.list:
        print("\n".join(sorted(ROUTERS)))
        return 0
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    problem = _check(args, routers, workloads)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    base = options(args, argv)
    work_dir = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="continuum-compare-"))
    failures: list[dict[str, str]] = []
    compile_packages()  # as an installed Continuum has them (continuum_bench.bytecode)
    try:
        if base.tokenizer == "hf":
            base = replace(base, hf_tokenizer=train_hf_tokenizer(work_dir / "tokenizer"))
        cpus = None if args.router_cpus is None else parse_cpus(args.router_cpus)
        run = compare(
            routers, workloads, base, work_dir, count_engine_calls=args.count_engine_calls, failures=failures,
            router_cpus=cpus,
        )  # fmt: skip
        reports = asyncio.run(run)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_summary(reports, failures, base, Path(args.out_dir), args.name or "compare-" + "-".join(workloads))
    print(f"router logs in {work_dir}")
    ok = all(r["results"]["ok"] == r["results"]["requests"] for r in reports)
    return 0 if ok and not failures else 1


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def write_summary(
    reports: Sequence[dict[str, Any]], failures: Sequence[dict[str, str]], base: FleetBenchOptions, out: Path, stem: str
) -> None:
    text = table(reports)
    added = added_table(reports)
    if added:
        text += (
            "\nTime to first token, mean, as the engines timed it (from their arrival) and as the client did:\n\n"
            + added
        )
    cpu = cpu_table(reports)
    if cpu:
        pinned = next((r["cpus"] for r in reports if "cpus" in r), None)
        where = (
            f"the router's processes on CPU(s) {_cpu_list(pinned['router'])}, "
            f"the engines and the load generator on {_cpu_list(pinned['engines_and_client'])}"
            if pinned
            else "the router's processes and the engines share the machine's cores"
        )
        text += f"\nCPU time during each run ({where}):\n\n" + cpu
    timing = timing_table(reports)
    if timing:
        text += (
            "\nInside the ingress, streamed requests up to their first chunk (means; the router's own /metrics,"
            ' docs/ingress.md "Where a request\'s time goes"):\n\n' + timing
        )
    legs = legs_table(reports)
    if legs:
        text += (
            "\nTime to first token leg by leg, p50 / mean in ms, real time (the client's and the engines' stamps"
            ' joined by request id, docs/sim-engine.md "What is reported"):\n\n' + legs
        )
    restarts = restart_table(reports)
    if restarts:
        text += "\nRouter restarted mid-run (client-side hits, each phase against the pooled ideal):\n\n" + restarts
    calls = calls_table(reports)
    if calls:
        text += "\nEngine calls per routed request (counted by the tap in front of the engines):\n\n" + calls
    if failures:
        text += "\nDid not run:\n\n" + "".join(f"* {f['workload']} via {f['router']}: {f['error']}\n" for f in failures)
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(f"Command: `{base.command}`\n\n{text}", encoding="utf-8")
    (out / f"{stem}.json").write_text(
        json.dumps({"runs": list(reports), "failures": list(failures)}, indent=2), encoding="utf-8"
    )
    print(f"wrote {out / (stem + '.md')}, {out / (stem + '.json')}")


if __name__ == "__main__":
    # Run the importable module's main, not this `__main__` copy: plugins import `continuum_bench.compare`
    # and register their routers in that module's ROUTERS.
    from continuum_bench.compare import main as _main

    sys.exit(_main())
