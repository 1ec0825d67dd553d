"""The router on cores of its own (`bench compare --router-cpus`), as in production, where the
router runs on other hosts than the GPU engines (Linux).

Without it the router's processes, the simulated engines and the load generator share the
machine's cores, so CPU a router spends (its KV listener, its bus, its own work) also delays the
engines and the client, and the report counts that delay as time the router added. With it
every process the benchmark started that is not an engine (the router, its helpers) runs on the
given CPUs only, and the engines and the benchmark itself on the others. Both settings are
reported as they are: the shared one says what a router costs on a crowded machine, the pinned
one what it adds to a request when it has its own cores.

    cpus = parse_cpus("1")                     # the router's CPUs
    async with kept_pinned(os.getpid(), engine_pids, cpus):
        ...                                    # the run

Pinning is applied to every thread of every process, and again every half second while the run
lasts, so threads and processes started later (a restarted router, a new worker) are pinned too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from pathlib import Path

from continuum_bench.fleet.cpu import descendants, take_snapshot

REPIN_EVERY_S = 0.5


def parse_cpus(text: str) -> frozenset[int]:
    """CPU numbers from a list such as "1", "2-3" or "0,2-3"; ValueError when malformed."""
    out: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (examples: 1, 2-3, 0,2-3)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"not a CPU list: {text!r} ({part} runs backwards)")
        out.update(range(first, last + 1))
    return frozenset(out)


@dataclass(frozen=True)
class CpuSplit:
    router: frozenset[int]
    rest: frozenset[int]  # the engines and the benchmark process


def split_cpus(router: frozenset[int], available: Collection[int]) -> CpuSplit:
    """The router's CPUs and the rest of `available`; ValueError when the router's are not all
    available or leave nothing for the engines."""
    missing = router - set(available)
    if missing:
        raise ValueError(f"--router-cpus: CPU(s) {sorted(missing)} not available to this process ({sorted(available)})")
    rest = frozenset(available) - router
    if not rest:
        raise ValueError("--router-cpus takes every CPU; the engines and the load generator need at least one")
    return CpuSplit(router, rest)


def pin_tree(root: int, engine_pids: Collection[int], split: CpuSplit, proc: Path = Path("/proc")) -> int:
    """Pin every thread below `root`: the engines (and what runs under them) and `root` itself
    to `split.rest`, every other process to `split.router`. Returns the threads moved."""
    _, tree = take_snapshot(root, proc)  # pid -> ppid of every process below root
    engines = set(engine_pids)
    for pid in engine_pids:
        engines |= descendants(tree, pid)
    moved = 0
    for pid in {root, *tree}:
        target = split.rest if pid == root or pid in engines else split.router
        moved += _pin_threads(proc, pid, target)
    return moved


def _pin_threads(proc: Path, pid: int, cpus: frozenset[int]) -> int:
    moved = 0
    with contextlib.suppress(OSError):  # the process exited meanwhile
        for task in (proc / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                tid = int(task.name)
                if os.sched_getaffinity(tid) != cpus:
                    os.sched_setaffinity(tid, cpus)
                    moved += 1
    return moved


@contextlib.asynccontextmanager
async def kept_pinned(root: int, engine_pids: Collection[int], split: CpuSplit | None) -> AsyncIterator[None]:
    """Pin now and keep pinning while the block runs (nothing when `split` is None)."""
    if split is None:
        yield
        return
    await asyncio.to_thread(pin_tree, root, engine_pids, split)

    async def repin() -> None:
        while True:
            await asyncio.sleep(REPIN_EVERY_S)
            await asyncio.to_thread(pin_tree, root, engine_pids, split)

    task = asyncio.create_task(repin())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
