"""The Docker side of scripts/compose-smoke: the compose project (containers, exec, logs, the
in-stack probe), traffic through the balancer, and the PASS/FAIL report. Standard library
only; every call has a timeout."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "deploy" / "compose"
PROBE = Path(__file__).with_name("compose_smoke_probe.py")
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
