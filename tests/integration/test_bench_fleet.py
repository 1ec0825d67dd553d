"""`continuum-router bench fleet` end to end on tiny, time-compressed workloads: real engines,
real HTTP, the reports on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from continuum_bench.fleet.runner import FleetBenchOptions, run_fleet_bench
from continuum_router.cli import main as router_cli
from continuum_sim import SimFleet

TINY = {
    "shared-prompt": ["--requests", "16", "--rate", "40", "--docs", "2", "--doc-tokens", "300", "--output-tokens", "8"],
    "multi-turn": [
        "--conversations",
        "4",
        "--turns",
        "3",
        "--rate",
        "20",
        "--system-tokens",
        "200",
        "--user-tokens",
        "20",
        "--output-tokens",
        "12",
        "--think-time",
        "0.2",
    ],
    "trace": ["--requests", "8", "--output-tokens", "8"],
    "conversations": ["--duration", "40", "--rate", "1", "--max-model-len", "16384"],
}


@pytest.mark.parametrize("workload", ["shared-prompt", "multi-turn", "trace", "conversations"])
def test_bench_fleet_direct_round_robin(workload: str, tmp_path: Path) -> None:
    argv = [
        "bench", "fleet", "--workload", workload, "--engines", "2", "--in-process", "--time-scale", "0.01",
        "--num-gpu-blocks", "1100", "--out-dir", str(tmp_path), "--name", "run", "--no-progress", *TINY[workload],
    ]  # fmt: skip
    assert router_cli(argv) == 0
    report = json.loads((tmp_path / "run.json").read_text())
    res = report["results"]
    assert res["errors"] == 0 and res["ok"] == res["requests"] > 0
    assert sum(e["requests"] for e in res["per_engine"]) == res["requests"], "engine metrics saw every request"
    assert res["imbalance"]["requests_max_over_mean"] <= 1.2, "round robin spreads requests evenly"
    assert 0.0 < res["ideal_hit_rate"] <= res["ideal_hit_rate_unbounded"] <= 1.0
    assert abs(res["hit_rate"] - res["client_hit_rate"]) < 1e-9, "engine /metrics agree with the usage chunks"
    if workload in ("shared-prompt", "multi-turn"):
        assert res["hit_rate"] > 0.3, "shared system prompts are reused"
    if workload == "conversations":
        assert report["workload"]["conversations"] >= 20 and res["hit_rate"] > 0.02, "system prompts are reused"
    for key in ("p50", "p90", "p99"):
        assert res["ttft_s"][key] is not None and res["ttft_s"][key] > 0
    assert res["ttft_s"]["p50"] <= res["e2e_s"]["p50"]
    engine_ttft = res["engine_ttft_s"]
    assert 0.0 < engine_ttft["mean"] <= res["ttft_s"]["mean"], "an engine times a request inside the client's time"
    assert engine_ttft["router_added_mean"] == pytest.approx(res["ttft_s"]["mean"] - engine_ttft["mean"])
    assert engine_ttft["engine_front_mean"] > 0, "the engines tokenized before their clock started"
    net = engine_ttft["router_added_mean"] - engine_ttft["engine_front_mean"]
    assert engine_ttft["router_added_net_mean"] == pytest.approx(net)
    text = (tmp_path / "run.md").read_text()
    assert "| run | direct-round-robin |" in text and "Time to first token, mean: engines" in text
    assert "Before their clock started the engines spent" in text
    first = engine_ttft["engine_first_chunk_mean"]
    assert engine_ttft["mean"] < first <= res["ttft_s"]["mean"], "the first chunk leaves after the engine's TTFT"
    assert engine_ttft["router_own_mean"] == pytest.approx(res["ttft_s"]["mean"] - first)
    legs = report["legs"]  # every request joined with its engine's stamps, its TTFT split in four
    assert legs["joined"] == res["requests"] and legs["not_joined"] == 0
    assert all(legs[leg]["p50"] >= 0 for leg in ("to_engine", "body", "back")) and legs["engine"]["p50"] > 0
    total_ms = sum(legs[leg]["mean"] for leg in ("to_engine", "body", "engine", "back"))
    assert total_ms == pytest.approx(res["ttft_s"]["mean"] * report["time_scale"] * 1000, rel=0.01, abs=0.01)
    assert (tmp_path / "run.png").stat().st_size > 1000


def test_bench_fleet_over_the_responses_api(tmp_path: Path) -> None:
    """`--api responses`: the multi-turn conversations go to /v1/responses; the engines serve
    the same prompts, so their prefix caches and the usage of the typed stream events agree."""
    argv = [
        "bench", "fleet", "--workload", "multi-turn", "--engines", "2", "--in-process", "--time-scale", "0.01",
        "--num-gpu-blocks", "1100", "--out-dir", str(tmp_path), "--name", "run", "--no-progress", "--no-plot",
        "--api", "responses", *TINY["multi-turn"],
    ]  # fmt: skip
    assert router_cli(argv) == 0
    res = json.loads((tmp_path / "run.json").read_text())["results"]
    assert res["errors"] == 0 and res["ok"] == res["requests"] == 12
    assert res["hit_rate"] > 0.3 and abs(res["hit_rate"] - res["client_hit_rate"]) < 1e-9
    assert 0.0 < res["hit_rate"] <= res["ideal_hit_rate_unbounded"] + 1e-9
    assert res["ttft_s"]["p50"] is not None and res["ttft_s"]["p50"] > 0


@pytest.mark.parametrize(("router", "errors"), [("direct-prefix-hash", 0), ("direct-round-robin", 1)])
def test_bench_fleet_with_stored_responses(tmp_path: Path, router: str, errors: int) -> None:
    """`--api responses-stored`: later turns name the previous response instead of repeating
    the conversation. Kept on one engine (prefix hash) every turn is answered from its store and
    cache; round robin sends turn 2 of the one conversation to the other engine, which does not
    hold the response (404, an error), and the conversation ends there as it does after any
    failed turn."""
    argv = [
        "bench", "fleet", "--router", router, "--workload", "multi-turn", "--engines", "2", "--in-process",
        "--time-scale", "0.01", "--num-gpu-blocks", "1100", "--out-dir", str(tmp_path), "--name", "run",
        "--no-progress", "--no-plot", "--api", "responses-stored", "--conversations", "1", "--turns", "3",
        "--rate", "20", "--system-prompts", "1", "--system-tokens", "200", "--user-tokens", "20",
        "--output-tokens", "8", "--think-time", "0.1",
    ]  # fmt: skip
    assert router_cli(argv) == 0
    res = json.loads((tmp_path / "run.json").read_text())["results"]
    assert (res["requests"], res["errors"]) == ((2, 1) if errors else (3, 0))
    if errors:
        assert any("404" in sample for sample in res["error_samples"])
    else:
        assert res["hit_rate"] > 0.3  # the history came from the engine's prefix cache


async def test_bench_against_a_router_url_on_an_attached_fleet(tmp_path: Path) -> None:
    """`--router URL` + `--fleet FILE`: the 'router' here is engine 0 itself, so all load lands
    there — the imbalance and per-engine figures must show it."""
    async with SimFleet(2, time_scale=0.01) as fleet:
        info = tmp_path / "fleet.json"
        fleet.write_info(info)
        opts = FleetBenchOptions(
            router=fleet.urls[0], router_label="engine-0", workload="shared-prompt", time_scale=0.01,
            requests=10, rate=40, docs=1, doc_tokens=200, output_tokens=4, fleet_file=str(info),
            write_backends=str(tmp_path / "backends.yaml"), progress=False, plot=False, wait_for_router=5,
        )  # fmt: skip
        report, results = await run_fleet_bench(opts)
    res = report["results"]
    assert res["ok"] == 10 and [e["requests"] for e in res["per_engine"]] == [10, 0]
    assert res["imbalance"]["requests_max_over_mean"] == 2.0
    assert res["hit_rate"] > 0.5 and res["hit_rate"] <= res["ideal_hit_rate"] + 1e-9
    doc = yaml.safe_load((tmp_path / "backends.yaml").read_text())
    assert [b["url"] for b in doc["backends"]] == fleet.urls
    assert [s["zmq_endpoint"] for s in doc["sources"]] == [e.kv_events_endpoint for e in fleet.endpoints]
    assert all(s["zmq_mode"] == "connect" and s["chat_template"] == "chatml" for s in doc["sources"])
    assert len(results) == 10


def test_bench_fleet_with_a_process_per_engine(tmp_path: Path) -> None:
    """`--engine-processes each`: every engine serves from a process of its own; the run is the
    same, and the report's memory is the engines' resident memory summed over their processes."""
    argv = [
        "bench", "fleet", "--workload", "multi-turn", "--engines", "2", "--engine-processes", "each",
        "--time-scale", "0.01", "--num-gpu-blocks", "1100", "--out-dir", str(tmp_path), "--name", "run",
        "--no-progress", "--no-plot", *TINY["multi-turn"],
    ]  # fmt: skip
    assert router_cli(argv) == 0
    report = json.loads((tmp_path / "run.json").read_text())
    res = report["results"]
    assert res["errors"] == 0 and res["ok"] == res["requests"] == 12
    assert sorted(e["requests"] for e in res["per_engine"]) == [6, 6], "round robin over both processes' engines"
    # One simulated engine process is ~80 MB resident here (numpy, zmq, the HTTP stack); the
    # report sums both (one process for both engines measured ~83 MB).
    assert report["rss_mb"]["start"] > 120
