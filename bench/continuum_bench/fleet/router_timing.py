"""Where a streamed request's time to first token went inside a Continuum ingress, read from
its own /metrics before and after a run (docs/ingress.md, "Where a request's time goes").

The ingress times each streamed request in four stages up to its first chunk (`read`: its
body read and parsed; `route`: to the request sent to the backend; `backend`: to the backend's
first chunk read; `to_client`: that chunk's way out) and samples its event loop's lag. Against
the engines' own first-chunk time and the client's time to first token, the means split the
router's own path:

    client TTFT = [before the ingress read the head + after it wrote the chunk]   (`outside`)
                + read (the client's body on its way in)
                + route + to_client                                        (the ingress's work)
                + backend = engine first chunk + the hops to and from the engine (`hops`)

A router without these metrics (a peer) gives None. Counts are summed over replicas.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

STAGES_NAME = "continuum_ingress_stream_stage_seconds"
LAG_NAME = "continuum_ingress_event_loop_lag_seconds"
STAGES = ("read", "route", "backend", "to_client")


@dataclass
class RouterTiming:
    # stage -> (count, sum of seconds)
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    # loop lag: cumulative bucket counts by upper bound, and the sum of seconds
    lag_buckets: dict[float, float] = field(default_factory=dict)
    lag_sum: float = 0.0

    def add(self, other: RouterTiming) -> RouterTiming:
        return self._combine(other, 1.0)

    def minus(self, other: RouterTiming) -> RouterTiming:
        return self._combine(other, -1.0)

    def _combine(self, other: RouterTiming, sign: float) -> RouterTiming:
        stages = {}
        for stage in set(self.stages) | set(other.stages):
            a, b = self.stages.get(stage, (0.0, 0.0)), other.stages.get(stage, (0.0, 0.0))
            stages[stage] = (a[0] + sign * b[0], a[1] + sign * b[1])
        bounds = set(self.lag_buckets) | set(other.lag_buckets)
        lag = {le: self.lag_buckets.get(le, 0.0) + sign * other.lag_buckets.get(le, 0.0) for le in bounds}
        return RouterTiming(stages, lag, self.lag_sum + sign * other.lag_sum)

    def stage_mean(self, stage: str) -> float | None:
        count, total = self.stages.get(stage, (0.0, 0.0))
        return total / count if count > 0 else None

    @property
    def streams(self) -> int:
        return int(self.stages.get("to_client", (0.0, 0.0))[0])

    @property
    def lag_count(self) -> float:
        return self.lag_buckets.get(float("inf"), 0.0)

    def lag_quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile of the loop lag (None without
        samples; inf when it lies past the last bound)."""
        total = self.lag_count
        if total <= 0:
            return None
        bounds = sorted(self.lag_buckets)
        counts = [self.lag_buckets[b] for b in bounds]
        return bounds[min(bisect.bisect_left(counts, q * total), len(bounds) - 1)]


def parse_timing(text: str) -> RouterTiming | None:
    """The stage and loop-lag samples of one /metrics text; None when it has neither."""
    timing = RouterTiming()
    seen = False
    for family in text_string_to_metric_families(text):
        if family.name not in (STAGES_NAME, LAG_NAME):
            continue
        seen = True
        for sample in family.samples:
            if family.name == STAGES_NAME:
                stage = sample.labels.get("stage", "")
                count, total = timing.stages.get(stage, (0.0, 0.0))
                if sample.name.endswith("_count"):
                    timing.stages[stage] = (count + sample.value, total)
                elif sample.name.endswith("_sum"):
                    timing.stages[stage] = (count, total + sample.value)
            elif sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                timing.lag_buckets[le] = timing.lag_buckets.get(le, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                timing.lag_sum += sample.value
    return timing if seen else None


async def scrape_timing(urls: Sequence[str], timeout_s: float = 5.0) -> RouterTiming | None:
    """The summed timing of the routers at `urls` (base URLs, with or without `/v1`); None when
    any of them does not export it or cannot be read."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:

        async def one(url: str) -> RouterTiming | None:
            base = url.rstrip("/").removesuffix("/v1")
            try:
                response = await client.get(base + "/metrics")
            except httpx.HTTPError:
                return None
            return parse_timing(response.text) if response.status_code == 200 else None

        found = await asyncio.gather(*(one(u) for u in urls))
    if not found or any(t is None for t in found):
        return None
    total = RouterTiming()
    for timing in found:
        assert timing is not None
        total = total.add(timing)
    return total


def timing_report(
    timing: RouterTiming, client_ttft_mean: float | None, engine_first_chunk: float | None
) -> dict[str, float | None]:
    """The means (seconds) for the report: the four stages, the hops to and from the engine
    (`backend` minus the engine's own first-chunk time), what the client saw beyond the
    ingress's stages (`outside`), and the loop lag."""
    means = {stage: timing.stage_mean(stage) for stage in STAGES}
    backend = means["backend"]
    hops = backend - engine_first_chunk if backend is not None and engine_first_chunk is not None else None
    stages = [m for m in means.values() if m is not None]
    outside = None
    if len(stages) == len(STAGES) and client_ttft_mean is not None:
        outside = client_ttft_mean - sum(stages)
    return {
        "streams": float(timing.streams),
        **{f"{stage}_mean": mean for stage, mean in means.items()},
        "engine_hops_mean": hops,
        "outside_mean": outside,
        "loop_lag_mean": timing.lag_sum / timing.lag_count if timing.lag_count > 0 else None,
        "loop_lag_p50": timing.lag_quantile(0.5),
        "loop_lag_p99": timing.lag_quantile(0.99),
    }


def timing_table(reports: Sequence[dict[str, Any]]) -> str:
    """One row per run whose router exported its timing (markdown; empty when none did)."""
    rows = []
    for report in reports:
        t = report.get("router_timing")
        if not t or not t.get("streams"):
            continue
        keys = ("read_mean", "route_mean", "to_client_mean", "backend_mean", "engine_hops_mean", "outside_mean")
        cells = [_ms(t.get(k)) for k in keys]
        lag = " / ".join(_ms(t.get(k)) for k in ("loop_lag_mean", "loop_lag_p50", "loop_lag_p99"))
        rows.append(
            f"| {report['workload']['workload']} | {report['router']} | {int(t['streams'])} | "
            + " | ".join([*cells, lag])
            + " |"
        )
    if not rows:
        return ""
    head = (
        "| workload | router | streams | read (ms) | route (ms) | to client (ms) | backend (ms) "
        "| hops to and from the engine (ms) | outside the ingress (ms) | loop lag mean / p50 / p99 (ms) |\n"
    )
    return head + "|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n" + "\n".join(rows) + "\n"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return "> last bucket" if seconds == float("inf") else f"{seconds * 1000:.2f}"
