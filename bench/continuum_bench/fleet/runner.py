"""One fleet benchmark run: start (or attach to) the engines, drive the workload, collect, report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from continuum_bench.fleet.conversations import ConversationShape, ConversationsWorkload
from continuum_bench.fleet.driver import Driver, Progress, RequestResult
from continuum_bench.fleet.ideal import IdealCache
from continuum_bench.fleet.legs import fetch_times, legs_of
from continuum_bench.fleet.legs import summarize as summarize_legs
from continuum_bench.fleet.report import MD_HEADER, markdown_row, summarize, write_outputs
from continuum_bench.fleet.scrape import reset_all, scrape_all
from continuum_bench.fleet.tokens import HfTokenizerFiles, Texts, TokenCodec, make_codec
from continuum_bench.fleet.trace import TraceWorkload
from continuum_bench.fleet.workloads import MultiTurnWorkload, SharedPromptWorkload, Workload
from continuum_sim import (
    EngineConfig,
    EngineEndpoints,
    KvEventsConfig,
    SimFleet,
    TimingConfig,
    listener_sources,
    router_backends,
)

BUILT_IN_ROUTERS = {"direct-round-robin": "direct", "direct-prefix-hash": "prefix-hash"}
WORKLOADS = ("shared-prompt", "multi-turn", "trace", "conversations")


@dataclass
class FleetBenchOptions:
    engines: int = 4
    router: str = "direct-round-robin"
    router_label: str | None = None
    workload: str = "shared-prompt"
    time_scale: float = 0.2
    seed: int = 1
    # engines
    num_gpu_blocks: int = 1500
    block_size: int = 16
    max_num_seqs: int = 256
    max_model_len: int = 16_384
    kv_events_era: str = "map"
    base_port: int = 0
    zmq_base_port: int = 0
    in_process: bool = False
    engine_processes: str = "one"  # one: all engines in one child process; each: a process per engine
    fleet_file: str | None = None
    reset: bool = True
    tokenizer: str = "builtin"  # builtin | hf (the engines and the workloads use the same one)
    hf_tokenizer: HfTokenizerFiles | None = None  # the trained files, when tokenizer == "hf"
    # workloads
    requests: int | None = None
    rate: float | None = None
    docs: int = 16
    doc_tokens: int = 3000
    question_tokens: int = 30
    output_tokens: int | None = None
    conversations: int = 64
    turns: int = 6
    system_prompts: int | None = None  # multi-turn 4; conversations 4
    system_tokens: int | None = None  # multi-turn 1000
    user_tokens: int = 80
    think_time: float = 5.0
    trace: str | None = None
    trace_limit: int | None = None
    trace_duration: float | None = None
    trace_start: float = 0.0
    duration: float | None = None  # conversations: seconds of conversation starts (600)
    # outputs
    out_dir: str = "bench/results"
    name: str | None = None
    plot: bool = True
    # also write <name>.requests.jsonl: one line per request (fleet/report.py `request_lines`)
    request_log: bool = False
    progress: bool = True
    print_backends: bool = False
    write_backends: str | None = None
    wait_for_router: float = 30.0
    request_timeout: float = 600.0
    # "responses": chat requests go to /v1/responses; "responses-stored": later turns by
    # previous_response_id (fleet/responses_form.py)
    api_form: str = "native"
    # seconds after the first request at which the router's front process is restarted
    # (`bench compare --restart-router-at`; fleet/driver.py "interruption")
    restart_router_at: float | None = None
    command: str = ""

    @property
    def label(self) -> str:
        if self.router_label:
            return self.router_label
        if self.router in BUILT_IN_ROUTERS:
            return self.router
        return ",".join(u.split("//", 1)[-1].rstrip("/") for u in router_list(self.router))


def router_list(router: str) -> list[str]:
    """`--router` names one URL, or several (comma-separated) replicas of one router."""
    return [u.strip() for u in router.split(",") if u.strip()]


def build_workload(opts: FleetBenchOptions, texts: Texts) -> Workload:
    if opts.workload == "shared-prompt":
        return SharedPromptWorkload(
            texts, requests=opts.requests or 400, rate=opts.rate or 8.0, docs=opts.docs, doc_tokens=opts.doc_tokens,
            question_tokens=opts.question_tokens, output_tokens=opts.output_tokens or 64, seed=opts.seed,
        )  # fmt: skip
    if opts.workload == "multi-turn":
        return MultiTurnWorkload(
            texts, conversations=opts.conversations, turns=opts.turns, rate=opts.rate or 1.0,
            system_prompts=opts.system_prompts or 4, system_tokens=opts.system_tokens or 1000, user_tokens=opts.user_tokens,
            output_tokens=opts.output_tokens or 120, think_time=opts.think_time, seed=opts.seed,
        )  # fmt: skip
    if opts.workload == "trace":
        kwargs: dict[str, Any] = {
            "limit": opts.trace_limit or opts.requests, "duration": opts.trace_duration, "start": opts.trace_start,
        }  # fmt: skip
        if opts.trace:
            kwargs["path"] = opts.trace
        return TraceWorkload(texts, max_model_len=opts.max_model_len, **kwargs)
    if opts.workload == "conversations":
        shape = ConversationShape()
        if opts.rate:
            shape = replace(shape, rate=opts.rate)
        if opts.system_prompts:
            shape = replace(shape, system_prompts=opts.system_prompts)
        return ConversationsWorkload(
            texts, duration=opts.duration or 600.0, seed=opts.seed, max_model_len=opts.max_model_len, shape=shape
        )
    raise ValueError(f"unknown workload {opts.workload!r}; choose one of {', '.join(WORKLOADS)}")


def codec_for(opts: FleetBenchOptions) -> TokenCodec:
    return make_codec(opts.tokenizer, opts.hf_tokenizer)


def engine_configs(opts: FleetBenchOptions) -> list[EngineConfig]:
    extra: dict[str, Any] = {}
    if opts.tokenizer == "hf":
        if opts.hf_tokenizer is None:
            raise ValueError("--tokenizer hf needs the trained tokenizer files")
        # EngineConfig's tokenizer / chat_template: the engine tokenizes with these files.
        extra = {"tokenizer": str(opts.hf_tokenizer.tokenizer), "chat_template": str(opts.hf_tokenizer.chat_template)}
    base = EngineConfig(
        num_gpu_blocks=opts.num_gpu_blocks,
        block_size=opts.block_size,
        max_num_seqs=opts.max_num_seqs,
        max_model_len=opts.max_model_len,
        timing=TimingConfig(time_scale=opts.time_scale),
        **extra,
    )
    configs = []
    for i in range(opts.engines):

        def port(b: int, off: int) -> int:
            return b + off if b else 0

        kv = KvEventsConfig(
            endpoint=f"tcp://127.0.0.1:{port(opts.zmq_base_port, 2 * i)}",
            replay_endpoint=f"tcp://127.0.0.1:{port(opts.zmq_base_port, 2 * i + 1)}",
            era=opts.kv_events_era,  # type: ignore[arg-type]
        )
        configs.append(replace(base, name=f"sim-{i}", port=port(opts.base_port, i), kv_events=kv))
    return configs


def _read_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


def _write_text(path: str, text: str) -> None:
    Path(path).write_text(text)


def fleet_process(opts: FleetBenchOptions) -> bool | Literal["each"]:
    """SimFleet's `process` for these options: in this process, one child, or one per engine."""
    if opts.in_process:
        return False
    return "each" if opts.engine_processes == "each" else True


@contextlib.asynccontextmanager
async def open_fleet(opts: FleetBenchOptions) -> AsyncIterator[tuple[list[EngineEndpoints], list[int]]]:
    """The engines to drive and the pids whose memory to sample."""
    if opts.fleet_file:
        data = _read_json(opts.fleet_file)
        pids = [int(pid) for pid in data.get("pids", [data["pid"]])]
        yield [EngineEndpoints.from_dict(e) for e in data["engines"]], pids
        return
    async with SimFleet(configs=engine_configs(opts), process=fleet_process(opts)) as fleet:
        yield fleet.endpoints, fleet.pids or [os.getpid()]


def backends_document(endpoints: list[EngineEndpoints]) -> dict[str, Any]:
    """Router `backends:` and listener `sources:` for these engines, plus their raw endpoints."""
    return {
        "backends": router_backends(endpoints),
        "sources": listener_sources(endpoints),
        "engines": [e.to_dict() for e in endpoints],
    }


class RssSampler:
    """The engines' resident memory, summed over their processes."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.samples: list[float] = []

    def sample(self) -> None:
        total, seen = 0.0, False
        for pid in self.pids:
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024
                        seen = True
        if seen:
            self.samples.append(total)

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.5)

    def summary(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        # Ten evenly spaced samples show whether memory levels off or keeps growing.
        step = max(1, len(self.samples) // 10)
        timeline = [round(x, 1) for x in self.samples[::step]]
        return {"start": self.samples[0], "peak": max(self.samples), "end": self.samples[-1], "timeline": timeline}


async def wait_for_router(base: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(base + "/models")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"router {base} did not answer GET /models within {wait_s:.0f}s")
            await asyncio.sleep(0.5)


def router_base(router: str) -> str:
    base = router.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


async def run_fleet_bench(
    opts: FleetBenchOptions,
    *,
    before_run: Callable[[], None] | None = None,
    on_interrupt: Callable[[list[str]], Awaitable[list[str]]] | None = None,
) -> tuple[dict[str, Any], list[RequestResult]]:
    """One run; `before_run` is called right before the first request is sent (after the
    router answered its readiness probe and the engines' caches were reset). With
    `opts.restart_router_at`, `on_interrupt` is called then with the router's URLs and returns
    the ones to use afterwards (the report gets a `restart` section)."""
    codec = codec_for(opts)
    workload = build_workload(opts, Texts(codec))
    async with open_fleet(opts) as (endpoints, pids):
        if opts.write_backends:
            _write_text(opts.write_backends, yaml.safe_dump(backends_document(endpoints), sort_keys=False))
        if opts.print_backends:
            print(yaml.safe_dump(backends_document(endpoints), sort_keys=False), flush=True)
        mode = BUILT_IN_ROUTERS.get(opts.router, "url")
        direct = mode != "url"
        targets = (
            [e.openai_base_url for e in endpoints] if direct else [router_base(u) for u in router_list(opts.router)]
        )
        if not direct:
            await asyncio.gather(*(wait_for_router(t, opts.wait_for_router) for t in targets))
        urls = [e.url for e in endpoints]
        capacity = sum(e.num_gpu_blocks - 1 for e in endpoints)
        ideal, unbounded = IdealCache(capacity, endpoints[0].block_size), IdealCache(None, endpoints[0].block_size)
        driver = Driver(
            targets, mode=mode, model=endpoints[0].model, time_scale=opts.time_scale,
            ideals=[ideal, unbounded], codec=codec, request_timeout=opts.request_timeout,
            progress=Progress(workload.total_requests, enabled=opts.progress), api_form=opts.api_form,
            interrupt_at=opts.restart_router_at if on_interrupt is not None and not direct else None,
            on_interrupt=None if on_interrupt is None else _restarter(opts, on_interrupt),
        )  # fmt: skip
        sampler = RssSampler(pids)
        async with httpx.AsyncClient() as http:
            if opts.reset:
                await reset_all(http, urls)
            await fetch_times(http, urls)  # forget the stamps of anything sent before the run
            before = await scrape_all(http, urls)
            sampling = asyncio.create_task(sampler.run())
            if before_run is not None:
                before_run()
            start = time.monotonic()
            try:
                results = await driver.run(workload)
            finally:
                sampling.cancel()
            duration = time.monotonic() - start
            await asyncio.sleep(0.05)  # let the engines publish the last step's counters
            after = await scrape_all(http, urls)
            stamps = await fetch_times(http, urls)
            sampler.sample()
    deltas = [a.minus(b) for a, b in zip(after, before, strict=True)]
    summary = summarize(
        results, deltas, [e.name for e in endpoints], ideal=ideal.hit_rate, ideal_unbounded=unbounded.hit_rate,
        time_scale=opts.time_scale, duration_real=duration, replicas=None if direct else targets,
    )  # fmt: skip
    e0 = endpoints[0]
    report = {
        "name": opts.name or f"fleet-{opts.workload}-{opts.label.replace('/', '_').replace(':', '_')}",
        "command": opts.command,
        "router": opts.label,
        "engines": len(endpoints),
        "time_scale": opts.time_scale,
        "engine_config": {
            "num_gpu_blocks": e0.num_gpu_blocks,
            "block_size": e0.block_size,
            "kv_capacity_tokens_per_engine": e0.kv_capacity_tokens,
            "max_num_seqs": opts.max_num_seqs,
            "max_model_len": opts.max_model_len,
            "tokenizer": opts.tokenizer,
        },
        "workload": workload.describe(),
        "results": summary,
        "rss_mb": sampler.summary(),
        "late_sends": driver.late_sends,
    }
    report["legs"] = join_legs(results, stamps)
    if driver.interruption is not None:
        report["restart"] = restart_summary(results, *driver.interruption)
    return report, results


def join_legs(results: list[RequestResult], stamps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each streamed request's TTFT split with its engine's stamps (fleet/legs.py), kept on the
    result for the request log; the report gets the legs' means and percentiles."""
    unmatched = 0
    for r in results:
        times = stamps.get(r.request_id or "")
        if times is None or r.sent_clock is None or r.ttft is None:
            unmatched += 1
            continue
        r.legs = legs_of(r.sent_clock, r.sent_clock + r.ttft, times)
        unmatched += r.legs is None
    return summarize_legs((r.legs for r in results if r.legs is not None), unmatched)


def _restarter(
    opts: FleetBenchOptions, restart: Callable[[list[str]], Awaitable[list[str]]]
) -> Callable[[list[str]], Awaitable[list[str]]]:
    """The driver's interruption: restart the router (its base URLs, as its factory gave them)
    and return the targets to use once the restarted router answers its readiness probe."""
    current = router_list(opts.router)

    async def interrupt(_targets: list[str]) -> list[str]:
        nonlocal current
        current = await restart(current)
        fresh = [router_base(u) for u in current]
        await asyncio.gather(*(wait_for_router(t, opts.wait_for_router) for t in fresh))
        return fresh

    return interrupt


def _phase(results: list[RequestResult]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    # None where the phase has nothing to divide (no request answered, or no hit possible)
    hits = sum(r.cached_tokens for r in ok) / prompt if prompt else None
    ideal = sum(r.ideal_hit_tokens for r in ok) / prompt if prompt else None
    ttfts = sorted(r.ttft for r in ok if r.ttft is not None)
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "hit_rate": hits,
        "ideal_hit_rate": ideal,
        "hit_rate_vs_ideal": hits / ideal if hits is not None and ideal else None,
        "ttft_p90_s": ttfts[min(len(ttfts) - 1, round(0.9 * (len(ttfts) - 1)))] if ttfts else None,
    }


def restart_summary(results: list[RequestResult], began: float, seconds: float, drained: float) -> dict[str, Any]:
    """The run before and after the router's restart: client-side hits (the engines' cached
    tokens as each response reported them) against the pooled ideal, per phase, and the first
    30 seconds after it on their own. The pause splits into the drain of the requests in flight
    (`drain_s`) and the restart itself, from SIGTERM to ready (`restart_s`)."""
    before = [r for r in results if r.sent_at < began]
    after = [r for r in results if r.sent_at >= began]
    soon = [r for r in after if r.sent_at < began + seconds + 30.0]
    return {
        "at_s": round(began, 3),
        "downtime_s": round(seconds, 3),
        "drain_s": round(drained, 3),
        "restart_s": round(seconds - drained, 3),
        "before": _phase(before),
        "after": _phase(after),
        "first_30s_after": _phase(soon),
    }


def report_and_print(report: dict[str, Any], results: list[RequestResult], opts: FleetBenchOptions) -> list[Path]:
    paths = write_outputs(report, results, Path(opts.out_dir), plot=opts.plot, request_log=opts.request_log)
    print(MD_HEADER + markdown_row(report), end="")
    return paths
