"""A request's TTFT split leg by leg from the client's and the engine's stamps (bench/fleet/legs.py)."""

from __future__ import annotations

import pytest

from continuum_bench.fleet.legs import Legs, legs_of, legs_table, summarize


def test_legs_split_the_time_to_first_token() -> None:
    stamps = {"head": 10.002, "arrived": 10.003, "submitted": 10.004, "first_chunk": 10.020, "first_content": 10.021}
    legs = legs_of(10.0, 10.025, stamps)
    assert legs is not None
    assert legs.to_engine == pytest.approx(0.002) and legs.body == pytest.approx(0.001)
    assert legs.engine == pytest.approx(0.018) and legs.back == pytest.approx(0.004)
    assert legs.to_engine + legs.body + legs.engine + legs.back == pytest.approx(0.025)


def test_incomplete_stamps_are_not_guessed() -> None:
    assert legs_of(10.0, 10.5, {"head": 10.1, "arrived": 10.2, "first_content": None}) is None
    assert legs_of(10.0, 10.5, {"head": 10.1}) is None


def test_summary_in_milliseconds_and_the_table() -> None:
    rows = [Legs(0.001 * n, 0.0, 0.010, 0.002) for n in range(1, 11)]
    out = summarize(rows, unmatched=2)
    assert out["joined"] == 10 and out["not_joined"] == 2
    assert out["to_engine"] == {"mean": 5.5, "p50": 5.0, "p90": 9.0}
    assert out["engine"]["p90"] == pytest.approx(10.0)
    report = {"workload": {"workload": "trace"}, "router": "r", "legs": out}
    table = legs_table([report, {"workload": {"workload": "trace"}, "router": "peer", "legs": {"joined": 0}}])
    assert "| trace | r | 10 | 2 | 5.00 / 5.50 | 0.00 / 0.00 | 10.00 / 10.00 | 2.00 / 2.00 |" in table
    assert "| peer |" not in table, "a run with nothing joined has no row"
    assert summarize([], unmatched=3) == {"joined": 0, "not_joined": 3}
    assert legs_table([]) == ""
