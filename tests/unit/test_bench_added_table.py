"""`bench compare`'s added-latency table: the router's own path, and the same over a router-less
baseline of the same workload (what the router itself added)."""

from __future__ import annotations

from typing import Any

from continuum_bench.compare import added_table


def _report(router: str, own: float, workload: str = "trace") -> dict[str, Any]:
    engine = {
        "mean": 0.8,
        "router_added_mean": own + 0.05,
        "engine_front_mean": 0.05,
        "router_added_net_mean": own,
        "engine_first_chunk_mean": 0.85,
        "router_own_mean": own,
    }
    return {
        "router": router,
        "workload": {"workload": workload},
        "results": {"ttft_s": {"mean": 1.2}, "engine_ttft_s": engine},
    }


def _last_cells(table: str) -> dict[str, str]:
    rows = [line.strip("|").split("|") for line in table.splitlines()[2:]]
    return {f"{cells[0].strip()}/{cells[1].strip()}": cells[-1].strip() for cells in rows}


def test_the_router_s_own_time_is_also_shown_over_the_direct_baseline_of_its_workload() -> None:
    table = added_table(
        [
            _report("direct-round-robin", 0.270),
            _report("smg-cache-aware", 0.352),
            _report("continuum-kv-precise", 0.379),
            _report("continuum-kv-precise", 0.020, workload="multi-turn"),  # no baseline ran it
        ]
    )
    assert "router's own over no router (ms)" in table.splitlines()[0]
    assert _last_cells(table) == {
        "trace/direct-round-robin": "0.00",
        "trace/smg-cache-aware": "82.00",
        "trace/continuum-kv-precise": "109.00",
        "multi-turn/continuum-kv-precise": "–",
    }


def test_without_a_baseline_the_column_is_empty() -> None:
    assert set(_last_cells(added_table([_report("smg-cache-aware", 0.3)])).values()) == {"–"}
