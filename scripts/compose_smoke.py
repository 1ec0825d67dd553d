"""Start deploy/compose on a Docker engine and check that it works and keeps working.

Run through `scripts/compose-smoke` (docs/operations.md, "Smoke test"). The steps, each printed
PASS or FAIL with what was seen:

1. build the image (once, by the `ingress` service) and bring the stack up;
2. traffic through the balancer: every request answered, every ingress replica serves;
3. the Redis Cluster and the JetStream cluster (R3 stream and heartbeat bucket) formed, every
   listener heartbeat arrives, the KV index fills, no NATS permission violation;
4. Prometheus scrapes every target; every Grafana panel query returns data;
5. a SIGHUP reloads NATS; the `gemini` profile starts gemini-cache and its target;
6. no container restarted;
7. the stack survives `docker compose restart ingress`, a crash of one ingress replica, one
   indexer, one NATS node and one Redis node, and `docker compose stop` / `start`: traffic
   flows again and the clusters are whole again within a deadline.

Standard library only; every call has a timeout. The stack is torn down (`down -v`) at the
end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "deploy" / "compose"
PROBE = Path(__file__).with_name("compose_smoke_probe.py")
DASHBOARD = COMPOSE_DIR / "grafana" / "dashboards" / "continuum.json"
BACKENDS = ("sim-1", "sim-2", "sim-3")
REDIS_NODES = ("redis-1", "redis-2", "redis-3")
MODEL = "continuum-sim-8b"
SYSTEM = (
    "You are the support assistant of a company that sells bicycles. Answer briefly and politely, "
    "name the part numbers you mention, and never promise delivery dates. " * 4
)


# ---------------------------------------------------------------------------- reporting


@dataclass
class Report:
    results: list[tuple[str, bool, str, float]] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str, seconds: float) -> bool:
        self.results.append((name, ok, detail, seconds))
        print(f"{'PASS' if ok else 'FAIL'}  {name:<34} {seconds:6.1f}s  {detail}", flush=True)
        return ok

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(ok for _, ok, _, _ in self.results)


def wait_for(predicate: Callable[[], tuple[bool, str]], deadline: float, interval: float = 1.0) -> tuple[bool, str]:
    """Call `predicate` until it holds or `deadline` seconds passed; its last verdict."""
    end = time.monotonic() + deadline
    while True:
        try:
            ok, detail = predicate()
        except (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        if ok or time.monotonic() >= end:
            return ok, detail
        time.sleep(interval)


# ---------------------------------------------------------------------------- docker


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    service: str
    running: bool
    restarts: int
    pid: int
    ips: tuple[str, ...]


class Stack:
    def __init__(self, project: str, files: list[Path], env: dict[str, str]) -> None:
        self.project = project
        self.files = files
        self.env = env

    def compose(self, *args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = ["docker", "compose", "-p", self.project]
        for path in self.files:
            command += ["-f", str(path)]
        return subprocess.run(
            [*command, *args], cwd=COMPOSE_DIR, env=self.env, input=stdin, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def services(self) -> list[str]:
        return self.compose("config", "--services").stdout.split()

    def containers(self, service: str | None = None) -> list[Container]:
        ids = self.compose("ps", "-a", "-q", *([service] if service else [])).stdout.split()
        if not ids:
            return []
        inspected = json.loads(self.docker("inspect", *ids).stdout or "[]")
        out = []
        for c in inspected:
            networks = c["NetworkSettings"]["Networks"] or {}
            out.append(
                Container(
                    id=c["Id"],
                    name=c["Name"].lstrip("/"),
                    service=c["Config"]["Labels"].get("com.docker.compose.service", "?"),
                    running=bool(c["State"]["Running"]),
                    restarts=int(c["RestartCount"]),
                    pid=int(c["State"]["Pid"]),
                    ips=tuple(n["IPAddress"] for n in networks.values() if n.get("IPAddress")),
                )
            )
        return sorted(out, key=lambda c: c.name)

    def exec(self, service: str, *command: str, stdin: str | None = None, timeout: float = 30) -> str:
        result = self.compose("exec", "-T", service, *command, stdin=stdin, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{service}: {' '.join(command)}: {result.stderr.strip()[-300:]}")
        return result.stdout

    def probe(self) -> dict[str, Any]:
        """Ask from inside the stack (scripts/compose_smoke_probe.py)."""
        try:
            return dict(json.loads(self.exec("ingress", "python", "-", stdin=PROBE.read_text(), timeout=40)))
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            return {"error": str(exc)}

    def logs(self, *services: str, since: float | None = None) -> str:
        args = ["logs", "--no-color"] + (["--since", str(int(since))] if since else [])
        return self.compose(*args, *services, timeout=60).stdout


# ---------------------------------------------------------------------------- traffic


@dataclass
class Traffic:
    ok: int = 0
    failed: int = 0
    replicas: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


def payload(i: int) -> dict[str, Any]:
    """Shapes the stack routes differently: cacheable first turns (temperature 0, a handful of
    questions, so the response cache sees hits and misses), later turns of conversations
    (the KV scorer), and streams (SSE through the balancer)."""
    question = {"role": "user", "content": f"Which tyre fits wheel model {i % 5}?"}
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}, question]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 8}
    if i % 3 == 0:
        body["temperature"] = 0
    elif i % 3 == 1:
        messages += [{"role": "assistant", "content": "Model T-700."}, {"role": "user", "content": f"And {i}?"}]
    else:
        body["stream"] = True
    body["messages"] = messages
    return body


def send(port: int, body: dict[str, Any], timeout: float = 30) -> tuple[int, str]:
    """One request through the balancer: (status or 0, the replica that answered or the error)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
            replica = response.headers.get("X-Continuum-Replica", "").split(",")[-1].strip()
            complete = b"[DONE]" in data if body.get("stream") else b'"choices"' in data
            return (response.status if complete else 0), replica
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("X-Continuum-Replica", "")
    except OSError as exc:
        return 0, type(exc).__name__


def traffic(port: int, count: int, start: int = 0) -> Traffic:
    seen = Traffic()
    for i in range(start, start + count):
        status, replica = send(port, payload(i))
        if status == 200:
            seen.ok += 1
            seen.replicas.add(replica.split(":")[0])
        else:
            seen.failed += 1
            seen.errors.append(f"{status} {replica}".strip())
    return seen


@dataclass
class Flow:
    flowing: bool
    seconds: float
    failures: list[str]

    def __str__(self) -> str:
        failed = f"{len(self.failures)} failed" + (f" {sorted(set(self.failures))[:3]}" if self.failures else "")
        return f"{'flowing' if self.flowing else 'NOT flowing'} after {self.seconds:.1f}s, {failed}"


def flows(port: int, deadline: float, streak: int = 5) -> Flow:
    """Send requests until `streak` in a row succeed."""
    started = time.monotonic()
    run = i = 0
    failures: list[str] = []
    while time.monotonic() - started < deadline:
        status, replica = send(port, payload(i), timeout=min(30.0, deadline))
        i += 1
        if status == 200:
            run += 1
            if run >= streak:
                return Flow(True, time.monotonic() - started, failures)
        else:
            run = 0
            failures.append(f"{status} {replica}".strip())
            time.sleep(0.2)
    return Flow(False, time.monotonic() - started, failures)


# ---------------------------------------------------------------------------- checks


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
        current = [f["name"] for f in state["followers"] if f["current"] and not f["offline"] and f["active"] < 5]
        whole = state["replicas"] == 3 and state["leader"] and len(current) == 2
        ok = ok and bool(whole)
        parts.append(f"{name} R{state['replicas']} leader={state['leader']} current followers={current}")
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


# ---------------------------------------------------------------------------- the run


@dataclass
class Smoke:
    stack: Stack
    report: Report
    http_port: int
    prom_port: int
    deadline: float
    requests: int
    gemini: bool = False
    crashed: dict[str, int] = field(default_factory=dict)

    def check(self, name: str, predicate: Callable[[], tuple[bool, str]], deadline: float | None = None) -> bool:
        started = time.monotonic()
        ok, detail = wait_for(predicate, self.deadline if deadline is None else deadline)
        return self.report.add(name, ok, detail, time.monotonic() - started)

    def expected_targets(self) -> dict[str, int]:
        jobs = {"ingress": len(ingress_ips(self.stack)), "indexer": 2, "kv-listener": 1, "engines": 3}
        return jobs | ({"gemini-cache": 1} if self.gemini else {})

    def healthy(self, name: str) -> bool:
        """Every replica serves and both clusters are whole (after a disturbance)."""
        ok = self.check(f"{name}: all running", lambda: all_running(self.stack))
        ok = (
            self.check(f"{name}: every replica serves", lambda: every_replica_serves(self.stack, self.http_port)) and ok
        )
        ok = self.check(f"{name}: Redis Cluster ok", lambda: redis_cluster_ok(self.stack)) and ok
        ok = self.check(f"{name}: JetStream whole", lambda: jetstream_ok(self.stack)) and ok
        return self.check(f"{name}: indexers ready", lambda: indexers_ready(self.stack)) and ok

    def disturb(self, name: str, action: Callable[[], tuple[bool, str]]) -> None:
        started = time.monotonic()
        done, how = action()
        flow = flows(self.http_port, self.deadline)
        ok = done and flow.flowing
        self.report.add(f"{name}: traffic flows", ok, f"{how}; {flow}", time.monotonic() - started)
        self.healthy(name)

    def crash(self, service: str) -> tuple[bool, str]:
        """SIGKILL the main process of one container, as the kernel's OOM killer would: the
        restart policy brings it back. On an engine whose processes are not visible here
        (a remote engine, Docker Desktop), `docker kill` + `docker start` instead."""
        victim = next(c for c in self.stack.containers(service) if c.running)
        started = time.monotonic()
        if victim.pid > 0 and Path(f"/proc/{victim.pid}").exists():
            os.kill(victim.pid, signal.SIGKILL)
            how, restarts = f"SIGKILL to {victim.name}", victim.restarts + 1
        else:
            self.stack.docker("kill", victim.id)
            time.sleep(2)
            self.stack.docker("start", victim.id)
            how, restarts = f"docker kill + start of {victim.name}", victim.restarts
        self.crashed[victim.name] = restarts

        def back() -> tuple[bool, str]:
            now = next((c for c in self.stack.containers(service) if c.id == victim.id), None)
            ok = now is not None and now.running and now.restarts == restarts and now.pid != victim.pid
            return ok, f"running again after {time.monotonic() - started:.1f}s" if ok else f"{now}"

        ok, detail = wait_for(back, self.deadline, interval=0.2)
        return ok, f"{how}, {detail}" if ok else f"{how}, NOT back: {detail}"

    def nats_reload(self) -> tuple[bool, str]:
        since = time.time() - 1
        # a SIGHUP from inside: `docker kill -s HUP` would also make Docker treat the container
        # as stopped by hand, so its restart policy would not apply until its next start
        self.stack.exec("nats-1", "nats-server", "--signal", "reload=1")
        time.sleep(2)
        log = self.stack.logs("nats-1", since=since)
        ok = "Reloaded server configuration" in log and all(c.running for c in self.stack.containers("nats-1"))
        return ok, "nats-1 reloaded its configuration" if ok else f"no reload in the log: {log.strip()[-200:]}"

    def start_gemini(self) -> tuple[bool, str]:
        self.stack.env["COMPOSE_PROFILES"] = "gemini"
        self.gemini = True
        result = self.stack.compose("up", "-d", "gemini-cache", timeout=180)
        if result.returncode != 0:
            return False, result.stderr.strip()[-300:]
        time.sleep(10)  # long enough for a crash loop to show
        containers = self.stack.containers("gemini-cache")
        ok = bool(containers) and all(c.running and c.restarts == 0 for c in containers)
        return ok, f"gemini-cache {[(c.running, c.restarts) for c in containers]}"


def bring_up(smoke: Smoke, build: bool) -> bool:
    stack, report = smoke.stack, smoke.report
    if build:
        started = time.monotonic()
        result = stack.compose("build", timeout=1800)
        built = [line for line in (result.stdout + result.stderr).splitlines() if line.strip().endswith(" Built")]
        ok = result.returncode == 0 and len(built) == 1
        detail = f"{len(built)} image(s) built: {[b.strip() for b in built]}"
        report.add(
            "build the image once",
            ok,
            detail if result.returncode == 0 else result.stderr[-400:],
            time.monotonic() - started,
        )
        if result.returncode != 0:
            return False
    started = time.monotonic()
    result = stack.compose("up", "-d", timeout=600)
    if not report.add(
        "docker compose up",
        result.returncode == 0,
        result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "",
        time.monotonic() - started,
    ):
        return False
    return smoke.check("stack running", lambda: all_running(stack))


def run_checks(smoke: Smoke) -> None:
    stack, http, prom = smoke.stack, smoke.http_port, smoke.prom_port
    started = time.monotonic()
    flow = flows(http, 180)
    smoke.report.add("balancer answers", flow.flowing, str(flow), time.monotonic() - started)
    started = time.monotonic()
    sent = traffic(http, smoke.requests)
    smoke.report.add(
        f"{smoke.requests} requests", sent.failed == 0, f"{sent.ok} ok, {sent.failed} failed {sent.errors[:3]}",
        time.monotonic() - started,
    )  # fmt: skip
    smoke.check("every ingress replica serves", lambda: every_replica_serves(stack, http))
    smoke.check("Redis Cluster formed", lambda: redis_cluster_ok(stack))
    smoke.check("JetStream cluster formed (R3)", lambda: jetstream_ok(stack))
    smoke.check("indexers ready", lambda: indexers_ready(stack))
    smoke.check("KV index fills", lambda: kv_index_fills(stack, http))
    smoke.check("no NATS permission violation", lambda: violations(stack), deadline=0)
    smoke.check("Prometheus scrapes every target", lambda: targets_up(stack, prom, smoke.expected_targets()))
    smoke.check(
        "every panel query returns data", lambda: panels_have_data(prom, http), deadline=max(smoke.deadline, 120)
    )
    smoke.check("NATS reloads on SIGHUP", smoke.nats_reload, deadline=0)
    smoke.check("profile gemini runs gemini-cache", smoke.start_gemini, deadline=0)
    smoke.check("gemini-cache target scraped", lambda: targets_up(stack, prom, smoke.expected_targets()))
    smoke.check("no container restarted", lambda: no_restarts(stack), deadline=0)


def run_disturbances(smoke: Smoke) -> None:
    stack = smoke.stack

    def restart_ingress() -> tuple[bool, str]:
        result = stack.compose("restart", "ingress", timeout=180)
        ok = result.returncode == 0
        return ok, "docker compose restart ingress" + ("" if ok else f" failed: {result.stderr[-200:]}")

    def stop_start() -> tuple[bool, str]:
        started = time.monotonic()
        stop = stack.compose("stop", timeout=300)
        stopped = time.monotonic() - started
        start = stack.compose("start", timeout=300)
        ok = stop.returncode == 0 and start.returncode == 0
        return ok, f"docker compose stop ({stopped:.1f}s, rc {stop.returncode}) && start (rc {start.returncode})"

    smoke.disturb("restart ingress", restart_ingress)
    for service in ("ingress", "indexer-1", "nats-2", "redis-2"):
        smoke.disturb(f"crash {service}", partial(smoke.crash, service))
    smoke.check("only the crashed containers restarted", lambda: no_restarts(stack, smoke.crashed), deadline=0)
    smoke.disturb("stop/start", stop_start)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/compose-smoke", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--offline", action="store_true", help="add compose.offline.yaml (no Jaeger, OTel Collector, Grafana)"
    )
    p.add_argument("--project", default="continuum-smoke", help="compose project name (default continuum-smoke)")
    p.add_argument("--no-build", action="store_true", help="use the image as it is")
    p.add_argument("--keep", action="store_true", help="leave the stack running (default: down -v at the end)")
    p.add_argument("--deadline", type=float, default=90.0, help="seconds each check may take to hold (default 90)")
    p.add_argument("--requests", type=int, default=60, help="requests of the first traffic check (default 60)")
    return p.parse_args(argv)


@contextmanager
def teardown(stack: Stack, keep: bool) -> Iterator[None]:
    try:
        yield
    finally:
        if keep:
            print(f"stack left running: docker compose -p {stack.project} ...", flush=True)
        else:
            stack.compose("down", "-v", "--remove-orphans", timeout=300)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    secrets = [COMPOSE_DIR / "secrets" / n for n in ("nats-router-password", "admin-token")]
    if not all(p.is_file() for p in secrets) or not (COMPOSE_DIR / ".env").is_file():
        subprocess.run([str(COMPOSE_DIR / "init-secrets.sh")], check=True)
    files = [COMPOSE_DIR / "docker-compose.yml"] + ([COMPOSE_DIR / "compose.offline.yaml"] if args.offline else [])
    http_port, prom_port = free_port(), free_port()
    env = {
        **os.environ,
        "CONTINUUM_HTTP_PORT": str(http_port),
        "CONTINUUM_PROMETHEUS_PORT": str(prom_port),
        "CONTINUUM_GRAFANA_PORT": str(free_port()),
        "CONTINUUM_JAEGER_PORT": str(free_port()),
    }
    env.pop("COMPOSE_PROFILES", None)
    stack = Stack(args.project, files, env)
    smoke = Smoke(stack, Report(), http_port, prom_port, args.deadline, args.requests)
    started = time.monotonic()
    print(f"compose-smoke: project {args.project}, balancer :{http_port}, Prometheus :{prom_port}", flush=True)
    with teardown(stack, args.keep):
        if bring_up(smoke, not args.no_build):
            run_checks(smoke)
            run_disturbances(smoke)
    failed = [name for name, ok, _, _ in smoke.report.results if not ok]
    verdict = "PASS" if smoke.report.passed else f"FAIL ({len(failed)}: {', '.join(failed)})"
    print(f"compose-smoke: {verdict} — {len(smoke.report.results)} checks in {time.monotonic() - started:.0f}s")
    return 0 if smoke.report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
