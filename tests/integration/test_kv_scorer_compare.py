"""`bench compare` drives real router process trees against one fleet: a small run through the
ingress with the KV index (listener, nats-server and ingress as subprocesses), so the driver the
peer-router comparison builds on keeps working."""

from __future__ import annotations

from pathlib import Path

from continuum_bench.compare import ROUTERS, compare, cpu_table, table
from continuum_bench.fleet.runner import FleetBenchOptions


async def test_compare_runs_the_kv_router_against_a_fleet(tmp_path: Path) -> None:
    assert {"continuum-round-robin", "continuum-prefix-hash", "continuum-prefix-hash-kv"} <= set(ROUTERS)
    base = FleetBenchOptions(
        engines=2, requests=16, rate=20.0, docs=2, doc_tokens=300, output_tokens=8, time_scale=0.05,
        in_process=True, plot=False, progress=False, out_dir=str(tmp_path / "results"), command="test",
    )  # fmt: skip
    reports = await compare(["continuum-prefix-hash-kv"], ["shared-prompt"], base, tmp_path / "work")
    (report,) = reports
    assert report["router"] == "continuum-prefix-hash-kv"
    assert report["results"]["ok"] == 16 and report["results"]["hit_rate"] > 0.5
    assert "| shared-prompt | continuum-prefix-hash-kv | 16 | 0 |" in table(reports)
    log = (tmp_path / "work" / "continuum-kv-memory.log").read_text()
    assert "listening on http://" in log


async def test_compare_reports_the_cpu_of_the_router_and_of_the_engines(tmp_path: Path) -> None:
    """With engines in their own processes, each run reports the CPU its router's process tree
    (ingress, KV listener, nats-server) and the engines used while it ran."""
    base = FleetBenchOptions(
        engines=2, requests=16, rate=20.0, docs=2, doc_tokens=300, output_tokens=8, time_scale=0.05,
        engine_processes="each", plot=False, progress=False, out_dir=str(tmp_path / "results"), command="test",
    )  # fmt: skip
    reports = await compare(["continuum-prefix-hash-kv"], ["shared-prompt"], base, tmp_path / "work")
    (report,) = reports
    cpu = report["cpu_s"]
    assert cpu["router"] > 0.0 and cpu["engines"] > 0.0, "both sides served 16 requests"
    assert cpu["router"] + cpu["engines"] < 60.0
    assert "| shared-prompt | continuum-prefix-hash-kv |" in cpu_table(reports)
