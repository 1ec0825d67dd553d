"""Summary figures of a fleet run, and their JSON / markdown / PNG forms under bench/results/.

Latencies are reported in simulated seconds (real seconds / time_scale), so runs at different
time scales compare; note that real HTTP and CPU overheads are inflated by the same factor.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from continuum_bench.fleet.driver import LATE_AFTER, RequestResult
from continuum_bench.fleet.scrape import EngineCounters

REQUEST_LOG_HELP = (
    "also write <name>.requests.jsonl: per request, in send order, the backend the router chose (when it names "
    "it), cached against ideal tokens, TTFT and E2E (counts and times only, no text)"
)

MD_HEADER = (
    "| run | router | workload | engines | requests | errors | hit rate | ideal | hit/ideal | TTFT p50 | TTFT p90 | TTFT p99 "
    "| E2E p50 | E2E p99 | req/s | out tok/s | imbalance req | imbalance tok |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
)


def _percentiles(values: Sequence[float], scale: float) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    arr = np.asarray(values, dtype=float) / scale
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(arr.mean())}


def _ratio(values: Sequence[float]) -> float | None:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


def summarize(
    results: Sequence[RequestResult],
    deltas: Sequence[EngineCounters],
    names: Sequence[str],
    *,
    ideal: float,
    ideal_unbounded: float,
    time_scale: float,
    duration_real: float,
    replicas: Sequence[str] | None = None,
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    queries = sum(d.queries for d in deltas)
    hits = sum(d.hits for d in deltas)
    hit_rate = hits / queries if queries else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    duration_sim = duration_real / time_scale
    errors: dict[str, int] = {}
    for r in results:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    per_engine = [
        {
            "name": name, "requests": int(d.requests), "prompt_tokens": int(d.prompt_tokens),
            "queries": int(d.queries), "hits": int(d.hits), "hit_rate": (d.hits / d.queries) if d.queries else 0.0,
            "preemptions": int(d.preemptions),
        }
        for name, d in zip(names, deltas, strict=True)
    ]  # fmt: skip
    ttft = _percentiles([r.ttft for r in ok if r.ttft is not None], time_scale)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_samples": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
        "hit_rate": hit_rate,
        "client_hit_rate": (sum(r.cached_tokens for r in ok) / prompt) if prompt else 0.0,
        "ideal_hit_rate": ideal,
        "ideal_hit_rate_unbounded": ideal_unbounded,
        "hit_rate_vs_ideal": (hit_rate / ideal) if ideal > 0 else None,
        "ttft_s": ttft,
        "engine_ttft_s": _engine_ttft(deltas, ttft, time_scale),
        "e2e_s": _percentiles([r.e2e for r in ok if r.e2e is not None], time_scale),
        "duration_real_s": duration_real,
        "duration_sim_s": duration_sim,
        "throughput": {
            "requests_per_s": len(ok) / duration_sim if duration_sim else 0.0,
            "output_tokens_per_s": sum(r.completion_tokens for r in ok) / duration_sim if duration_sim else 0.0,
            "prompt_tokens_per_s": prompt / duration_sim if duration_sim else 0.0,
        },
        "imbalance": {
            "requests_max_over_mean": _ratio([d.requests for d in deltas]),
            "prompt_tokens_max_over_mean": _ratio([d.prompt_tokens for d in deltas]),
        },
        "per_engine": per_engine,
        "per_replica": _per_replica(results, replicas) if replicas else None,
    }


def _engine_ttft(
    deltas: Sequence[EngineCounters], client: dict[str, float | None], time_scale: float
) -> dict[str, float] | None:
    """Mean time to first token the engines saw, and what the router added to it on average.

    The engines time a request from its arrival, the client from its send: the difference of the
    means is the router's request path plus the first chunk's way back through it (the client's
    own overhead is the same for every router). None when the engines do not report it.

    Engines that report their front time (the simulator: rendering and tokenizing, from the
    body read to its clock's start) also give `engine_front_mean` and
    `router_added_net_mean`, the router's share with that engine work taken out; and those that
    time the first chunk handed to their HTTP server give `engine_first_chunk_mean` and
    `router_own_mean` (the client's mean minus it): the router's own path, with everything the
    engine processes did (their tokenizing, and waiting for their busy event loops) taken out.
    """
    count = sum(d.ttft_count for d in deltas)
    client_mean = client["mean"]
    if count <= 0 or client_mean is None:
        return None
    mean = sum(d.ttft_sum for d in deltas) / count
    out = {"mean": mean, "router_added_mean": client_mean - mean}
    front_count = sum(d.front_count for d in deltas)
    if front_count > 0:
        front = sum(d.front_sum for d in deltas) / front_count / time_scale  # real → simulated s
        out["engine_front_mean"] = front
        out["router_added_net_mean"] = client_mean - mean - front
    first_count = sum(d.first_chunk_count for d in deltas)
    if first_count > 0:
        first = sum(d.first_chunk_sum for d in deltas) / first_count / time_scale
        out["engine_first_chunk_mean"] = first
        out["router_own_mean"] = client_mean - first
    return out


def _per_replica(results: Sequence[RequestResult], replicas: Sequence[str]) -> list[dict[str, Any]]:
    """Requests (and errors) per router replica: how the driver's round robin spread them."""
    requests, errors = [0] * len(replicas), [0] * len(replicas)
    for r in results:
        if r.replica is not None:
            requests[r.replica] += 1
            errors[r.replica] += 0 if r.ok else 1
    return [{"url": u, "requests": n, "errors": e} for u, n, e in zip(replicas, requests, errors, strict=True)]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_row(report: dict[str, Any]) -> str:
    res = report["results"]
    ttft, e2e, thr, imb = res["ttft_s"], res["e2e_s"], res["throughput"], res["imbalance"]
    cells = [
        report["name"], report["router"], report["workload"]["workload"], str(report["engines"]), str(res["requests"]),
        str(res["errors"]), f"{res['hit_rate']:.1%}", f"{res['ideal_hit_rate']:.1%}",
        "-" if res["hit_rate_vs_ideal"] is None else f"{res['hit_rate_vs_ideal']:.2f}",
        _fmt(ttft["p50"]), _fmt(ttft["p90"]), _fmt(ttft["p99"]), _fmt(e2e["p50"], 2), _fmt(e2e["p99"], 2),
        f"{thr['requests_per_s']:.2f}", f"{thr['output_tokens_per_s']:.0f}",
        _fmt(imb["requests_max_over_mean"], 2), _fmt(imb["prompt_tokens_max_over_mean"], 2),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |\n"


def markdown(report: dict[str, Any]) -> str:
    res = report["results"]
    lines = [
        f"# Fleet benchmark `{report['name']}`\n\n",
        f"Command: `{report['command']}`  \n",
        f"Time scale {report['time_scale']} (latencies in simulated seconds); engine config: "
        f"{json.dumps(report['engine_config'])}; workload: {json.dumps(report['workload'])}\n\n",
        MD_HEADER,
        markdown_row(report),
        "\n| engine | requests | prompt tokens | hit rate | preemptions |\n|---|---:|---:|---:|---:|\n",
    ]
    lines += [
        f"| {e['name']} | {e['requests']} | {e['prompt_tokens']} | {e['hit_rate']:.1%} | {e['preemptions']} |\n"
        for e in res["per_engine"]
    ]
    if res.get("engine_ttft_s"):
        eng = res["engine_ttft_s"]
        lines.append(
            f"\nTime to first token, mean: engines {eng['mean'] * 1000:.2f} ms from arrival; "
            f"the router added {eng['router_added_mean'] * 1000:.2f} ms (client mean minus engine mean)\n"
        )
        if "engine_front_mean" in eng:
            lines.append(
                f"Before their clock started the engines spent {eng['engine_front_mean'] * 1000:.2f} ms on a request"
                f" (template, tokenizing): the router's own share is {eng['router_added_net_mean'] * 1000:.2f} ms\n"
            )
        if "engine_first_chunk_mean" in eng:
            lines.append(
                f"The engines handed the first chunk to their HTTP server {eng['engine_first_chunk_mean'] * 1000:.2f} ms"
                f" after arrival: the router's own path took {eng['router_own_mean'] * 1000:.2f} ms\n"
            )
    if res.get("per_replica") and len(res["per_replica"]) > 1:
        lines.append(
            "\nRequests per router replica: "
            + ", ".join(f"{r['url']} {r['requests']} ({r['errors']} errors)" for r in res["per_replica"])
            + "\n"
        )
    if report.get("engine_calls"):
        lines.append("\n" + engine_calls_markdown(report["engine_calls"]))
    if report.get("rss_mb"):
        rss = report["rss_mb"]
        lines.append(
            f"\nEngine process RSS (MB): start {rss['start']:.0f}, peak {rss['peak']:.0f}, end {rss['end']:.0f}; "
            f"over the run: {', '.join(f'{x:.0f}' for x in rss.get('timeline', []))}\n"
        )
    if report.get("late_sends"):
        lines.append(
            f"\n{report['late_sends']} requests went out more than {LATE_AFTER * 1000:.0f} ms after their time: the"
            " benchmark's client could not prepare them sooner\n"
        )
    if res["error_samples"]:
        lines.append("\nErrors: " + "; ".join(f"{k} (x{v})" for k, v in res["error_samples"].items()) + "\n")
    return "".join(lines)


def write_outputs(
    report: dict[str, Any], results: Sequence[RequestResult], out_dir: Path, *, plot: bool, request_log: bool = False
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = report["name"]
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(markdown(report))
    if request_log:
        paths.append(out_dir / f"{name}.requests.jsonl")
        paths[-1].write_text("".join(json.dumps(line) + "\n" for line in request_lines(results, report["time_scale"])))
    if plot:
        png = out_dir / f"{name}.png"
        if _plot(report, results, png):
            paths.append(png)
    return paths


def request_lines(results: Sequence[RequestResult], scale: float) -> list[dict[str, Any]]:
    """One record per request, in the order they were sent: when, where the router sent it (when
    it says), what the engine had cached against what the ideal cache would have, and the
    latencies, in simulated seconds as in the report. Counts and times only, never text: two
    runs of one workload can be compared request by request (the n-th request sent is the same
    request in both, but for requests sent at the same instant)."""
    out = []
    for r in sorted(results, key=lambda r: r.sent_at):
        out.append({
            "sent_at": round(r.sent_at / scale, 6), "ok": r.ok, "backend": r.backend, "replica": r.replica,
            "engine": r.engine, "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
            "ideal_hit_tokens": r.ideal_hit_tokens, "completion_tokens": r.completion_tokens,
            "ttft": None if r.ttft is None else round(r.ttft / scale, 6),
            "e2e": None if r.e2e is None else round(r.e2e / scale, 6),
            # real milliseconds, as the client and the engine stamped them (fleet/legs.py)
            "legs_ms": None if r.legs is None else {k: round(v * 1000.0, 3) for k, v in asdict(r.legs).items()},
        })  # fmt: skip
    return out


def _plot(report: dict[str, Any], results: Sequence[RequestResult], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the PNG (pip install 'continuum-router[bench]')", file=sys.stderr)
        return False
    res = report["results"]
    scale = report["time_scale"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ttfts = np.sort([r.ttft / scale for r in results if r.ok and r.ttft is not None])
    if len(ttfts):
        axes[0].plot(ttfts, np.arange(1, len(ttfts) + 1) / len(ttfts))
    axes[0].set(title="TTFT CDF", xlabel="seconds (simulated)", ylabel="fraction of requests")
    names = [e["name"] for e in res["per_engine"]]
    x = np.arange(len(names))
    reqs = [e["requests"] for e in res["per_engine"]]
    toks = [e["prompt_tokens"] / 1000 for e in res["per_engine"]]
    axes[1].bar(x - 0.2, reqs, 0.4, label="requests")
    axes[1].bar(x + 0.2, toks, 0.4, label="prompt ktokens")
    axes[1].set_xticks(x, names)
    axes[1].set(title="load per engine")
    axes[1].legend()
    axes[2].bar(
        ["hit rate", "ideal", "ideal (unbounded)"],
        [res["hit_rate"], res["ideal_hit_rate"], res["ideal_hit_rate_unbounded"]],
    )
    axes[2].set(title=f"prefix-cache hit rate ({report['router']})", ylim=(0, 1))
    fig.suptitle(f"{report['name']}: {report['workload']['workload']}, {report['engines']} engines")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def engine_calls_markdown(calls: dict[str, Any]) -> str:
    """The engines' HTTP calls by route during the run (counted by the tap in front of them)."""
    routed = calls["routed_requests"]
    lines = ["| route | calls | per routed request |\n|---|---:|---:|\n"]
    for route, count in sorted(calls["by_route"].items(), key=lambda kv: -kv[1]):
        lines.append(
            f"| `{route}` | {count} | {count / routed:.2f} |\n" if routed else f"| `{route}` | {count} | - |\n"
        )
    return "".join(lines)
