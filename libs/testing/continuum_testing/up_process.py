"""`continuum-router up` as a real process, for the lifecycle tests: start it, read its output,
find its children and ports, and wait (with a deadline) for them to be gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from continuum_common.children import process_alive

ROUTER = (sys.executable, "-m", "continuum_router")


def env(level: str = "WARNING") -> dict[str, str]:
    return {**os.environ, "CONTINUUM_LOG_LEVEL": level}


async def start_up(cwd: Path, *args: str) -> asyncio.subprocess.Process:
    """`up ARGS` in `cwd`, stdout and stderr merged into one pipe."""
    return await asyncio.create_subprocess_exec(
        *ROUTER, "up", *args, cwd=cwd, env=env(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def read_until(stream: asyncio.StreamReader, pattern: str, limit: float) -> tuple[re.Match[str], str]:
    seen = ""
    async with asyncio.timeout(limit):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"process output ended before {pattern!r}:\n{seen}")
            seen += line
            match = re.search(pattern, line)
            if match:
                return match, seen


async def run_to_end(*argv: str, cwd: Path, limit: float = 30.0, level: str = "INFO") -> tuple[int, str, str]:
    """Run a command to its end: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env(level),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(limit):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def lock_record(state_dir: Path) -> dict[str, object]:
    record: dict[str, object] = json.loads((state_dir / "up.lock").read_text())
    return record


def recorded_children(state_dir: Path) -> dict[str, int]:
    children = lock_record(state_dir)["children"]
    assert isinstance(children, list)
    return {str(c["name"]): int(c["pid"]) for c in children}


def children_of(pid: int) -> set[int]:
    """Running processes whose parent is `pid` (from /proc)."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
            found.add(int(entry.name))
    return found


def listening_ports(state_dir: Path, ingress_url: str, nats_pid: int) -> list[int]:
    """Every TCP port of a running `up --demo`: the ingress, nats-server (from its command line),
    the engines' HTTP and ZMQ ports (from the files `--demo` wrote)."""
    ports = [urlsplit(ingress_url).port or 0]
    argv = Path(f"/proc/{nats_pid}/cmdline").read_bytes().split(b"\0")
    ports.append(int(argv[argv.index(b"-p") + 1]))
    config = yaml.safe_load((state_dir / "demo-config.yaml").read_text())
    ports += [urlsplit(b["url"]).port or 0 for b in config["backends"]]
    listener = yaml.safe_load((state_dir / "demo-listener.yaml").read_text())
    for source in listener["sources"]:
        for key in ("zmq_endpoint", "replay_endpoint"):
            if source.get(key):
                ports.append(int(source[key].rsplit(":", 1)[1]))
    assert all(ports), ports
    return ports


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def wait_all_gone(pids: Sequence[int], ports: Sequence[int], limit: float = 10.0) -> tuple[list[int], list[int]]:
    """Poll until no pid runs and no port accepts a connection, or `limit` seconds pass;
    returns what still ran / listened at the end."""
    deadline = time.monotonic() + limit
    while True:
        alive = [p for p in pids if process_alive(p)]
        listening = [p for p in ports if port_open(p)]
        if (not alive and not listening) or time.monotonic() > deadline:
            return alive, listening
        await asyncio.sleep(0.1)


async def stop(proc: asyncio.subprocess.Process, sig: int, limit: float = 30.0) -> int:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    async with asyncio.timeout(limit):
        return await proc.wait()


def kill_leftovers(pids: Sequence[int]) -> None:
    """After a failed test: SIGKILL whatever of `pids` still runs, so it does not outlive the run."""
    for pid in pids:
        if process_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
