"""`bench compare`'s reading of the ingress's own timing: the stage and loop-lag samples parsed
from the ingress's real exposition, differences between two scrapes, the split of the client's
time to first token, and the table."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from continuum_bench.fleet.router_timing import parse_timing, timing_report, timing_table
from continuum_ingress.metrics import IngressMetrics
from continuum_ingress.pool import BackendPool


def exposition(stages: list[tuple[float, float, float, float]], lags: list[float]) -> str:
    metrics = IngressMetrics(BackendPool())
    for stage in stages:
        metrics.stream_stages(*stage)
    for lag in lags:
        metrics.loop_lag(lag)
    return generate_latest(metrics.registry).decode()


def test_the_ingress_exposition_is_read_back() -> None:
    stages = [(0.001, 0.002, 0.5, 0.001), (0.003, 0.004, 0.7, 0.003)]
    timing = parse_timing(exposition(stages, [0.0001] * 98 + [0.02, 0.3]))
    assert timing is not None and timing.streams == 2
    assert timing.stage_mean("read") == pytest.approx(0.002)
    assert timing.stage_mean("route") == pytest.approx(0.003)
    assert timing.stage_mean("backend") == pytest.approx(0.6)
    assert timing.stage_mean("to_client") == pytest.approx(0.002)
    assert timing.lag_count == 100
    assert timing.lag_quantile(0.5) == 0.0001  # the bucket's upper bound
    assert timing.lag_quantile(0.99) == 0.025
    assert timing.lag_quantile(1.0) == 1.0


def test_a_router_without_the_metrics_gives_none() -> None:
    assert parse_timing('vllm:num_requests_running{model_name="m"} 0.0\n') is None


def test_the_difference_of_two_scrapes_is_the_run() -> None:
    before = parse_timing(exposition([(1.0, 1.0, 1.0, 1.0)], [0.5]))
    after = parse_timing(exposition([(1.0, 1.0, 1.0, 1.0), (0.001, 0.002, 0.4, 0.001)], [0.5, 0.001]))
    assert before is not None and after is not None
    run = after.minus(before)
    assert run.streams == 1 and run.stage_mean("backend") == pytest.approx(0.4)
    assert run.lag_count == 1 and run.lag_sum == pytest.approx(0.001)


def test_the_client_ttft_is_split_around_the_ingress() -> None:
    timing = parse_timing(exposition([(0.001, 0.002, 0.5, 0.001)], [0.001]))
    assert timing is not None
    report = timing_report(timing, client_ttft_mean=0.510, engine_first_chunk=0.490)
    assert report["engine_hops_mean"] == pytest.approx(0.010)  # backend 0.5 - engine 0.49
    assert report["outside_mean"] == pytest.approx(0.006)  # 0.510 - (0.001 + 0.002 + 0.5 + 0.001)
    assert report["loop_lag_mean"] == pytest.approx(0.001)
    nothing = timing_report(timing, client_ttft_mean=None, engine_first_chunk=None)
    assert nothing["engine_hops_mean"] is None and nothing["outside_mean"] is None


def test_the_table_has_a_row_per_timed_run_only() -> None:
    timing = parse_timing(exposition([(0.001, 0.002, 0.5, 0.001)], [0.001]))
    assert timing is not None
    timed = {
        "workload": {"workload": "trace"},
        "router": "continuum-kv-precise",
        "router_timing": timing_report(timing, 0.51, 0.49),
    }
    peer = {"workload": {"workload": "trace"}, "router": "smg-cache-aware"}
    text = timing_table([timed, peer])
    assert "| trace | continuum-kv-precise | 1 | 1.00 | 2.00 | 1.00 | 500.00 | 10.00 | 6.00 |" in text
    assert "smg" not in text
    assert timing_table([peer]) == ""
