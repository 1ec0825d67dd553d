"""`bench compare --router-cpus` (bench/continuum_bench/fleet/pinning.py): CPU lists, the split,
and the pinning of real processes' threads through /proc."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from continuum_bench import compare
from continuum_bench.fleet.pinning import CpuSplit, kept_pinned, parse_cpus, pin_tree, split_cpus

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")

# A process with a second thread started after it was pinned (threads inherit their creator's CPUs).
THREADED = (
    "import threading, time\ntime.sleep(0.5)\nthreading.Thread(target=time.sleep, args=(30,)).start()\ntime.sleep(30)"
)


def test_cpu_lists_parse_and_bad_ones_are_refused() -> None:
    assert parse_cpus("1") == {1}
    assert parse_cpus("0,2-3") == {0, 2, 3}
    assert parse_cpus("4-5") == {4, 5}
    for bad in ("", "a", "1-", "3-1", "1,,2", "-1"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpus(bad)


def test_the_split_leaves_the_engines_a_cpu_and_names_only_available_ones() -> None:
    assert split_cpus(frozenset({1}), [0, 1]) == CpuSplit(frozenset({1}), frozenset({0}))
    with pytest.raises(ValueError, match="not available"):
        split_cpus(frozenset({7}), [0, 1])
    with pytest.raises(ValueError, match="takes every CPU"):
        split_cpus(frozenset({0, 1}), [0, 1])


def test_compare_refuses_a_bad_cpu_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare.main(["--router-cpus", "x"]) == 2
    assert "not a CPU list" in capsys.readouterr().err
    everything = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    assert compare.main(["--router-cpus", everything]) == 2
    assert "takes every CPU" in capsys.readouterr().err
    assert compare.main(["--router-cpus", "4096"]) == 2
    assert "not available" in capsys.readouterr().err


def _threads(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs (CI has two)")
def test_router_processes_and_their_threads_move_the_engines_stay_apart() -> None:
    available = sorted(os.sched_getaffinity(0))
    split = split_cpus(frozenset({available[-1]}), available)
    router = subprocess.Popen([sys.executable, "-c", THREADED])
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:

        async def run() -> None:
            async with kept_pinned(os.getpid(), [engine.pid], split):
                deadline = time.monotonic() + 10
                while len(_threads(router.pid)) < 2 or any(
                    os.sched_getaffinity(t) != split.router for t in _threads(router.pid)
                ):
                    assert time.monotonic() < deadline, "the router's late thread was never pinned"
                    await asyncio.sleep(0.05)

        asyncio.run(run())
        assert os.sched_getaffinity(engine.pid) == split.rest
        assert os.sched_getaffinity(0) == split.rest  # the load generator goes with the engines
        assert pin_tree(os.getpid(), [engine.pid], split) == 0  # nothing left to move
    finally:
        # This process and everything it runs (servers other tests started) back on every CPU.
        everything = frozenset(available)
        pin_tree(os.getpid(), [], CpuSplit(everything, everything))
        for proc in (router, engine):
            proc.kill()
            proc.wait()
