"""A request's time to first token, leg by leg, from the client's and the engine's own stamps.

The benchmark's client sends every request with an `x-request-id` and stamps its send and its
first content on `time.monotonic()`; the simulated engines stamp the same requests on the same
clock (CLOCK_MONOTONIC is one clock for every process of a host) when their handler began, when
the body was read, and when the stream's first chunk and its first content were handed to their
HTTP server to be written (GET /sim/request-times). Joined by id, they split each request's TTFT
into:

* `to_engine`: the client's send to the engine's handler beginning: the client's own sending,
  the router's whole request path (reading, choosing, forwarding), and the time the request
  waited in the engine's socket for its event loop;
* `body`: the handler's start to the body read (a long body arrives in several reads);
* `engine`: the body read to the first content chunk handed to the engine's HTTP server: the
  engine's own time to first token, its tokenizing and scheduling included;
* `back`: from there to the client reading that content: the engine's write, the router's relay
  and the client's read.

A router must pass the client's `x-request-id` on to the engine for its requests to be joined
(Continuum, smg and direct sends do; requests that were not joined are counted, not guessed).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

LEGS = ("to_engine", "body", "engine", "back")


@dataclass(frozen=True, slots=True)
class Legs:
    to_engine: float
    body: float
    engine: float
    back: float


async def fetch_times(client: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Every engine's stamps by request id (reading them clears them on the engine); an engine
    that does not have the route (not a simulated engine) contributes nothing."""

    async def one(url: str) -> list[dict[str, Any]]:
        try:
            resp = await client.get(url + "/sim/request-times", timeout=10.0)
        except httpx.HTTPError:
            return []
        if resp.status_code != 200:
            return []
        requests = resp.json().get("requests")
        return requests if isinstance(requests, list) else []

    out: dict[str, dict[str, Any]] = {}
    for records in await asyncio.gather(*(one(u) for u in urls)):
        for record in records:
            if isinstance(record, dict) and isinstance(record.get("id"), str):
                out[record["id"]] = record
    return out


def legs_of(sent: float, first: float, times: dict[str, Any]) -> Legs | None:
    """One request's legs in seconds, or None when the engine's stamps are incomplete (a request
    that failed, or one that was not streamed)."""
    head, arrived, content = times.get("head"), times.get("arrived"), times.get("first_content")
    if not (isinstance(head, float) and isinstance(arrived, float) and isinstance(content, float)):
        return None
    return Legs(to_engine=head - sent, body=arrived - head, engine=content - arrived, back=first - content)


def summarize(legs: Iterable[Legs], unmatched: int) -> dict[str, Any]:
    """Mean, p50 and p90 of each leg in milliseconds, and how many requests were joined."""
    rows = list(legs)
    out: dict[str, Any] = {"joined": len(rows), "not_joined": unmatched}
    if not rows:
        return out
    for name in LEGS:
        values = sorted(getattr(r, name) * 1000.0 for r in rows)
        out[name] = {
            "mean": round(statistics.fmean(values), 3),
            "p50": round(_quantile(values, 0.5), 3),
            "p90": round(_quantile(values, 0.9), 3),
        }
    return out


def _quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted values."""
    index = min(len(values) - 1, max(0, int(q * len(values) + 0.5) - 1))
    return values[index]


def legs_table(reports: Sequence[dict[str, Any]]) -> str:
    """One row per run that joined requests: each leg's p50 / mean in milliseconds."""
    rows = []
    for report in reports:
        legs = report.get("legs") or {}
        if not legs.get("joined"):
            continue
        cells = " | ".join(f"{legs[name]['p50']:.2f} / {legs[name]['mean']:.2f}" for name in LEGS)
        rows.append(
            f"| {report['workload']['workload']} | {report['router']} | {legs['joined']} | {legs['not_joined']} | {cells} |"
        )
    if not rows:
        return ""
    head = "| workload | router | joined | not joined | to the engine | body read | engine | back to the client |\n"
    return head + "|---|---|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"
