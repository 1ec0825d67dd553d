"""`continuum-router bench fleet` (also `python -m continuum_bench.fleet`): a fleet benchmark run.

Starts N simulated engines (or attaches to running ones with `--fleet FILE` written by
`continuum-sim-engine --info-file FILE`), sends a workload through a router — the built-in
direct round-robin baseline or any OpenAI-compatible URL — and reports the fleet's prefix-cache
hit rate next to the workload's ideal, TTFT and end-to-end percentiles, throughput, load
imbalance and errors, as JSON + markdown (+ PNG) under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from continuum_bench.bytecode import compile_packages
from continuum_bench.fleet.report import REQUEST_LOG_HELP
from continuum_bench.fleet.responses_form import API_FORMS
from continuum_bench.fleet.runner import WORKLOADS, FleetBenchOptions, report_and_print, run_fleet_bench
from continuum_bench.fleet.tokens import TOKENIZER_CHOICES, train_hf_tokenizer


def build_parser() -> argparse.ArgumentParser:
    d = FleetBenchOptions()
    p = argparse.ArgumentParser(
        prog="continuum-router bench fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--router",
        default=d.router,
        help="direct-round-robin (default), direct-prefix-hash, or a router's base URL, e.g. http://127.0.0.1:8080; "
        "several comma-separated URLs are replicas of one router, taken in turn per request",
    )
    p.add_argument("--router-label", help="name of the router in reports (default: the URL's host:port)")
    p.add_argument("--workload", choices=WORKLOADS, default=d.workload)
    p.add_argument(
        "--time-scale", type=float, default=d.time_scale, help="real seconds per simulated second (default 0.2)"
    )
    p.add_argument("--seed", type=int, default=d.seed)

    _engine_args(p.add_argument_group("engines"), d)
    _workload_args(p.add_argument_group("workloads"), d)
    o = p.add_argument_group("output")
    o.add_argument("--out-dir", default=d.out_dir)
    o.add_argument("--name", help="file stem of the results (default fleet-<workload>-<router>)")
    o.add_argument("--no-plot", dest="plot", action="store_false")
    o.add_argument("--request-log", action="store_true", help=REQUEST_LOG_HELP)
    o.add_argument("--no-progress", dest="progress", action="store_false")
    o.add_argument("--request-timeout", type=float, default=d.request_timeout, help="real seconds per request")
    return p


def _engine_args(e: argparse._ArgumentGroup, d: FleetBenchOptions) -> None:
    e.add_argument("--engines", type=int, default=d.engines, help="simulated engines to start (default 4)")
    e.add_argument(
        "--num-gpu-blocks", type=int, default=d.num_gpu_blocks, help="KV blocks per engine (default 1500 = 24k tokens)"
    )
    e.add_argument("--block-size", type=int, default=d.block_size)
    e.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    e.add_argument("--max-model-len", type=int, default=d.max_model_len)
    e.add_argument("--kv-events-era", choices=("map", "array", "sglang"), default=d.kv_events_era)
    e.add_argument(
        "--tokenizer", choices=TOKENIZER_CHOICES, default=d.tokenizer,
        help="builtin: the simulator's; hf: train a small Hugging Face tokenizer (continuum_sim.hf_tokenizer) and "
        "run the engines and the workloads with it",
    )  # fmt: skip
    e.add_argument(
        "--tokenizer-dir", help="where --tokenizer hf trains its files (default: a new temp dir; training is "
        "deterministic, so engines attached with --fleet get the same tokenizer by training into their own dir)",
    )  # fmt: skip
    e.add_argument("--base-port", type=int, default=0, help="fixed HTTP ports base+i (default: free ports)")
    e.add_argument("--zmq-base-port", type=int, default=0, help="fixed PUB ports base+2i, replay base+2i+1")
    e.add_argument(
        "--in-process", action="store_true", help="run the engines in this process (default: a child process)"
    )
    e.add_argument(
        "--engine-processes", choices=("one", "each"), default=d.engine_processes,
        help="one: all engines in one child process (the default, as earlier runs); each: a process per engine, "
        "as real engines each have their own API server (a slow /tokenize on one no longer delays the others)",
    )  # fmt: skip
    e.add_argument(
        "--fleet", dest="fleet_file", help="attach to engines started with continuum-sim-engine --info-file FILE"
    )
    e.add_argument("--no-reset", dest="reset", action="store_false", help="keep the engines' prefix caches warm")
    e.add_argument("--print-backends", action="store_true", help="print router backends / listener sources (YAML)")
    e.add_argument("--write-backends", metavar="FILE", help="write router backends / listener sources (YAML) to FILE")
    e.add_argument(
        "--wait-for-router", type=float, default=d.wait_for_router, help="seconds to wait for the router's /v1/models"
    )


def _workload_args(w: argparse._ArgumentGroup, d: FleetBenchOptions) -> None:
    w.add_argument("--requests", type=int, help="shared-prompt: requests (400); trace: max lines")
    w.add_argument(
        "--rate", type=float, help="shared-prompt: requests/s (8); multi-turn: conversations/s (1); conversations: "
        "conversation starts/s (2.3)",
    )  # fmt: skip
    w.add_argument("--output-tokens", type=int, help="answer length (shared-prompt 64, multi-turn 120)")
    w.add_argument("--docs", type=int, default=d.docs)
    w.add_argument("--doc-tokens", type=int, default=d.doc_tokens)
    w.add_argument("--question-tokens", type=int, default=d.question_tokens)
    w.add_argument("--conversations", type=int, default=d.conversations)
    w.add_argument("--turns", type=int, default=d.turns)
    w.add_argument("--system-prompts", type=int, help="multi-turn 4, conversations 4")
    w.add_argument("--system-tokens", type=int, help="multi-turn 1000")
    w.add_argument("--user-tokens", type=int, default=d.user_tokens)
    w.add_argument("--think-time", type=float, default=d.think_time, help="mean seconds between turns")
    w.add_argument("--trace", help="Mooncake JSONL (default bench/continuum_bench/traces/mooncake_synthetic.jsonl)")
    w.add_argument("--trace-duration", type=float, help="replay only the first N trace seconds (from --trace-start)")
    w.add_argument(
        "--trace-start", type=float, default=d.trace_start,
        help="replay the trace from this second on (a later window of a long trace; its first request comes at once)",
    )  # fmt: skip
    w.add_argument("--trace-limit", type=int, help="replay only the first N trace lines")
    w.add_argument("--duration", type=float, help="conversations: seconds of conversation starts (600)")
    w.add_argument(
        "--api", dest="api_form", choices=API_FORMS, default=d.api_form,
        help="responses: send the chat workloads' requests to /v1/responses (instructions + input items); "
        "responses-stored: later turns continue the previous response (previous_response_id + new messages)",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = vars(build_parser().parse_args(argv))
    tokenizer_dir = args.pop("tokenizer_dir")
    opts = FleetBenchOptions(**args, command="continuum-router bench fleet " + shlex.join(argv))
    if opts.engines < 1 or opts.time_scale <= 0 or opts.trace_start < 0:
        print("error: --engines must be >= 1, --time-scale > 0 and --trace-start >= 0", file=sys.stderr)
        return 2
    compile_packages()  # as an installed Continuum has them (continuum_bench.bytecode)
    try:
        if opts.tokenizer == "hf":
            directory = Path(tokenizer_dir) if tokenizer_dir else Path(tempfile.mkdtemp(prefix="continuum-tokenizer-"))
            opts.hf_tokenizer = train_hf_tokenizer(directory)
        report, results = asyncio.run(run_fleet_bench(opts))
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    paths = report_and_print(report, results, opts)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if report["results"]["ok"] else 1
