"""CPU time of the processes around a run, read from /proc (Linux).

On a benchmark machine the router, its helpers (KV listener, nats-server) and the simulated
engines share the same cores, so a router that burns more CPU also slows the engines' HTTP
handling, and that shows up as "router added" time. `bench compare` therefore reports, per run,
the CPU seconds of the router's processes (every process the benchmark started that is not an
engine) and of the engines.

    before = await cpu_snapshot(os.getpid())
    ...                                     # the run
    after = await cpu_snapshot(os.getpid())
    usage = cpu_used(before, after, engine_pids)   # CpuUsage(router_s=..., engines_s=...)

A process counted is identified by (pid, start time), so a pid reused between the snapshots is
not mixed up with the old one. Time of processes that exited between the two snapshots (a
restarted router's old process) is not counted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# (pid, start time in clock ticks) → (CPU seconds (user + system), command name)
Snapshot = dict[tuple[int, int], tuple[float, str]]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuUsage:
    router_s: float  # every descendant of the benchmark that is not an engine (or under one)
    engines_s: float  # the engine processes and their descendants
    # the router's side by process name (the kernel's command name: "continuum-route",
    # "nats-server", ...), to see which of its processes used the time
    router_by_name: dict[str, float] = field(default_factory=dict)


def parse_stat(text: str) -> tuple[int, int, float, str]:
    """(ppid, start time in ticks, CPU seconds, command name) from one /proc/<pid>/stat line.
    The command name (field 2) may hold spaces and parentheses, so fields are counted after
    the last ')'."""
    close = text.rindex(")")
    rest = text[close + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15, starttime 22.
    ppid, utime, stime, start = int(rest[1]), int(rest[11]), int(rest[12]), int(rest[19])
    return ppid, start, (utime + stime) / _TICKS, text[text.index("(") + 1 : close]


def descendants(parents: Mapping[int, int], root: int) -> set[int]:
    """Every pid below `root` in the tree given by pid → ppid (not `root` itself)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack.extend(children.get(pid, ()))
    return out


def _read_all(proc: Path) -> dict[int, tuple[int, int, float, str]]:
    out: dict[int, tuple[int, int, float, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            out[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited while being read, or not a process directory
    return out


def take_snapshot(root: int, proc: Path = Path("/proc")) -> tuple[Snapshot, dict[int, int]]:
    """CPU seconds of every process below `root`, and the tree (pid → ppid) they form."""
    stats = _read_all(proc)
    tree = {pid: stat[0] for pid, stat in stats.items()}
    below = descendants(tree, root)
    return {(pid, stats[pid][1]): (stats[pid][2], stats[pid][3]) for pid in below}, {pid: tree[pid] for pid in below}


async def cpu_snapshot(root: int) -> tuple[Snapshot, dict[int, int]]:
    """`take_snapshot` off the event loop (it reads every /proc/<pid>/stat)."""
    return await asyncio.to_thread(take_snapshot, root)


def cpu_used(
    before: tuple[Snapshot, dict[int, int]], after: tuple[Snapshot, dict[int, int]], engine_pids: Collection[int]
) -> CpuUsage:
    """CPU spent between two snapshots, split into the engines (`engine_pids` and what runs
    under them) and the rest (the router's processes). A process new in `after` counts whole."""
    old, _ = before
    new, tree = after
    engines = set(engine_pids)
    for pid in engine_pids:
        engines |= descendants(tree, pid)
    router = engine = 0.0
    by_name: dict[str, float] = {}
    for key, (seconds, name) in new.items():
        spent = seconds - old.get(key, (0.0, name))[0]
        if key[0] in engines:
            engine += spent
        else:
            router += spent
            by_name[name] = by_name.get(name, 0.0) + spent
    return CpuUsage(router_s=router, engines_s=engine, router_by_name=by_name)
