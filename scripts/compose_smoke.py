"""Start deploy/compose on a Docker engine and check that it works and keeps working.

Run through `scripts/compose-smoke` (docs/operations.md, "Smoke test"). The steps, each printed
PASS or FAIL with what was seen:

1. build the image (once, by the `ingress` service) and bring the stack up;
2. traffic through the balancer: every request answered, every ingress replica serves;
3. the Redis Cluster and the JetStream cluster (every NATS node in the meta group, R3 stream and
   heartbeat bucket) formed, every listener heartbeat arrives, the KV index fills, no NATS permission violation;
4. Prometheus scrapes every target; every Grafana panel query returns data;
5. a SIGHUP reloads NATS; the `gemini` profile starts gemini-cache and its target;
6. no container restarted;
7. the stack survives `docker compose restart ingress`; a crash (SIGKILL of the main process:
   the restart policy brings it back) and a `docker kill` (the container stays down until
   `docker start`) of one ingress replica, one indexer, one NATS node and one Redis node; and
   `docker compose stop` / `start`: traffic flows (while down, too, after a `docker kill`),
   and every replica serves and both clusters are whole again within a deadline.

Standard library only; every call has a timeout. The stack is torn down (`down -v`) at the
end unless --keep. `--nats-starts N` checks only the NATS cluster's first start, N times
(scripts/compose_smoke_nats.py). With `--offline` a NATS image the local engine lacks is built
from the offline stand-in first.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from compose_smoke_checks import (
    all_running,
    every_replica_serves,
    indexers_ready,
    ingress_ips,
    jetstream_ok,
    kv_index_fills,
    no_restarts,
    panels_have_data,
    redis_cluster_ok,
    targets_up,
    violations,
)
from compose_smoke_nats import ensure_offline_nats, fresh_starts, meta_group
from compose_smoke_stack import COMPOSE_DIR, Report, Stack, flows, traffic, wait_for


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
        victim = next((c for c in self.stack.containers(service) if c.running), None)
        if victim is None:
            return False, f"no running {service} container to crash"
        started = time.monotonic()
        if victim.pid > 0 and Path(f"/proc/{victim.pid}").exists():
            os.kill(victim.pid, signal.SIGKILL)
            how, restarts = f"SIGKILL to {victim.name}", victim.restarts + 1
        else:
            self.stack.docker("kill", victim.id)
            time.sleep(2)
            self.stack.docker("start", victim.id)
            how, restarts = f"docker kill + start of {victim.name}", 0  # `docker start` resets the count
        self.crashed[victim.name] = restarts

        def back() -> tuple[bool, str]:
            now = next((c for c in self.stack.containers(service) if c.id == victim.id), None)
            ok = now is not None and now.running and now.restarts == restarts and now.pid != victim.pid
            return ok, f"running again after {time.monotonic() - started:.1f}s" if ok else f"{now}"

        ok, detail = wait_for(back, self.deadline, interval=0.2)
        return ok, f"{how}, {detail}" if ok else f"{how}, NOT back: {detail}"

    def outage(self, service: str) -> None:
        """`docker kill` one container. Docker counts that as stopped by hand (no restart
        policy applies), so the rest of the stack carries the traffic until it is started
        again, as an operator would."""
        name = f"docker kill {service}"
        started = time.monotonic()
        victim = next((c for c in self.stack.containers(service) if c.running), None)
        if victim is None:
            self.report.add(f"{name}: traffic flows while down", False, f"no running {service} container", 0.0)
            return
        killed = self.stack.docker("kill", victim.id).returncode == 0
        flow = flows(self.http_port, self.deadline)
        down = not any(c.running for c in self.stack.containers(service) if c.id == victim.id)
        detail = f"{victim.name} {'down' if down else 'running again'}; {flow}"
        self.report.add(
            f"{name}: traffic flows while down", killed and down and flow.flowing, detail, time.monotonic() - started
        )
        started = time.monotonic()
        result = self.stack.docker("start", victim.id)
        self.crashed[victim.name] = 0  # `docker start` resets the restart count
        self.report.add(
            f"{name}: docker start", result.returncode == 0, result.stderr.strip()[-200:], time.monotonic() - started
        )
        self.healthy(name)

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
    smoke.check("JetStream meta group of 3", lambda: meta_group(stack))
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
    for service in ("ingress", "indexer-2", "nats-3", "redis-3"):
        smoke.outage(service)
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
    p.add_argument(
        "--nats-starts", type=int, default=0, metavar="N",
        help="instead of the whole stack: start the three NATS services N times on empty volumes and check "
        "that every node joins the JetStream meta group",
    )  # fmt: skip
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
    if args.offline and not smoke.check("offline NATS image", partial(ensure_offline_nats, stack), deadline=0):
        return 1
    if args.nats_starts:
        starts = fresh_starts(stack, args.nats_starts, args.deadline)
        left_out = sum(1 for _, ok, _, _ in starts.results if not ok)
        print(f"compose-smoke: {left_out} of {args.nats_starts} fresh NATS starts left a node out of the meta group")
        return 0 if starts.passed else 1
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
