"""The checks of scripts/compose-smoke: each returns (holds, what was seen) and is retried by
the caller until it holds or its deadline passes."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any

from compose_smoke_stack import COMPOSE_DIR, Stack, traffic

DASHBOARD = COMPOSE_DIR / "grafana" / "dashboards" / "continuum.json"
BACKENDS = ("sim-1", "sim-2", "sim-3")
REDIS_NODES = ("redis-1", "redis-2", "redis-3")


def ingress_ips(stack: Stack) -> set[str]:
    return {ip for c in stack.containers("ingress") if c.running for ip in c.ips}


def every_replica_serves(stack: Stack, port: int) -> tuple[bool, str]:
    expected = ingress_ips(stack)
    seen = traffic(port, 5 * max(len(expected), 1), start=int(time.time()))
    missing = expected - seen.replicas
    ok = bool(expected) and not missing and seen.failed == 0
    return ok, f"{len(expected)} replicas, served by {len(seen.replicas & expected)}, failed {seen.failed}" + (
        f" ({seen.errors[:3]})" if seen.errors else ""
    )


def redis_cluster_ok(stack: Stack) -> tuple[bool, str]:
    states = []
    for node in REDIS_NODES:
        try:
            info = dict(
                line.split(":", 1) for line in stack.exec(node, "redis-cli", "cluster", "info").split() if ":" in line
            )
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return False, f"{node}: {exc}"
        states.append((node, info.get("cluster_state"), info.get("cluster_slots_ok"), info.get("cluster_known_nodes")))
    ok = all(s == "ok" and slots == "16384" and known == str(len(REDIS_NODES)) for _, s, slots, known in states)
    return ok, ", ".join(f"{n} {s} slots_ok={slots} nodes={k}" for n, s, slots, k in states)


def jetstream_ok(stack: Stack) -> tuple[bool, str]:
    probe = stack.probe()
    streams = probe.get("jetstream")
    if not isinstance(streams, dict):
        return False, str(probe.get("jetstream_error") or probe.get("error"))
    parts, ok = [], True
    for name, state in streams.items():
        if "error" in state:
            ok = False
            parts.append(f"{name}: {state['error']}")
            continue
        # current, online, and heard from within two of the leader's 1 s heartbeats
        current = [f["name"] for f in state["followers"] if f["current"] and not f["offline"] and f["active"] < 2.5]
        behind = [
            f"{f['name']}(current={f['current']}, offline={f['offline']}, active={f['active']:.1f}s)"
            for f in state["followers"]
            if f["name"] not in current
        ]
        whole = state["replicas"] == 3 and state["leader"] and len(current) == 2
        ok = ok and bool(whole)
        parts.append(f"{name} R{state['replicas']} leader={state['leader']} current followers={current}")
        parts += [f"{name} behind: {behind}"] if behind else []
    beats = probe.get("heartbeats", [])
    ok = ok and sorted(beats) == sorted(BACKENDS)
    parts.append(f"heartbeats={beats or probe.get('heartbeats_error')}")
    return ok, "; ".join(parts)


def indexers_ready(stack: Stack) -> tuple[bool, str]:
    status = stack.probe().get("indexers", {})
    return bool(status) and all(s == 200 for s in status.values()), f"/healthz {status}"


def kv_index_fills(stack: Stack, port: int) -> tuple[bool, str]:
    traffic(port, 6, start=int(time.time()))
    counts = {}
    for node in REDIS_NODES:
        try:
            keys = stack.exec(node, "redis-cli", "--scan", "--pattern", "cr:kvidx:*").split()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return False, f"{node}: {exc}"
        counts[node] = len(keys)
    return sum(counts.values()) > 0, f"cr:kvidx:* keys per node {counts}"


def prometheus(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())["data"]


def targets_up(stack: Stack, prom_port: int, expected: dict[str, int]) -> tuple[bool, str]:
    try:
        active = prometheus(prom_port, "targets")["activeTargets"]
    except (OSError, ValueError, KeyError) as exc:
        return False, f"Prometheus API: {exc}"
    jobs: dict[str, list[str]] = {}
    for target in active:
        jobs.setdefault(target["labels"]["job"], []).append(target["health"])
    ok = all(len(jobs.get(job, [])) == n and all(h == "up" for h in jobs.get(job, [])) for job, n in expected.items())
    ok = ok and set(jobs) <= set(expected)
    return ok, " ".join(f"{job}={health.count('up')}/{len(health)}" for job, health in sorted(jobs.items()))


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], t["expr"]) for panel in dashboard["panels"] for t in panel.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(?:continuum_[a-z0-9_]+|vllm:[a-z0-9_:]+)", expr))


def exposed(name: str, metadata: dict[str, Any]) -> bool:
    """Some target exposes `name` (as a family: counters and histograms are named without
    their sample suffixes, or with _total, depending on the client library)."""
    base = re.sub(r"_(bucket|count|sum|total)$", "", name)
    return any(n in metadata for n in (name, base, f"{base}_total"))


def panels_have_data(prom_port: int, http_port: int) -> tuple[bool, str]:
    """Every metric a panel names is exposed by a target, and every panel query returns at
    least one number."""
    traffic(http_port, 6, start=int(time.time()))
    empty = []
    queries = panel_queries()
    metadata = prometheus(prom_port, "metadata")
    unknown = sorted({n for _, expr in queries for n in metric_names(expr) if not exposed(n, metadata)})
    for title, expr in queries:
        try:
            result = prometheus(prom_port, "query", query=expr)["result"]
        except (OSError, ValueError, KeyError) as exc:
            empty.append(f"{title} ({exc})")
            continue
        if not any(math.isfinite(float(r["value"][1])) for r in result):
            empty.append(title)
    detail = f"{len(queries) - len(empty)}/{len(queries)} queries return data"
    detail += f"; empty: {empty}" if empty else ""
    detail += f"; metrics no target exposes: {unknown}" if unknown else ""
    return not empty and not unknown, detail


def violations(stack: Stack) -> tuple[bool, str]:
    lines = [line for line in stack.logs("nats-1", "nats-2", "nats-3").splitlines() if "Violation" in line]
    return not lines, f"{len(lines)} permission violations" + (f": {lines[0][-160:]}" if lines else "")


def no_restarts(stack: Stack, allowed: dict[str, int] | None = None) -> tuple[bool, str]:
    allowed = allowed or {}
    bad = [
        f"{c.name} (restarts={c.restarts}, running={c.running})"
        for c in stack.containers()
        if c.restarts != allowed.get(c.name, 0) or not c.running
    ]
    return not bad, "every container running, restart counts as expected" if not bad else f"unexpected: {bad}"


def all_running(stack: Stack) -> tuple[bool, str]:
    services = stack.services()
    running = {c.service for c in stack.containers() if c.running}
    missing = [s for s in services if s not in running]
    return not missing, f"{len(services)} services running" if not missing else f"not running: {missing}"
