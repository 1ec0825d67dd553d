"""The state-directory lock of `up` (statelock.py) with real processes: leftovers of a dead `up`
are stopped with their process groups, a recycled pid is left alone, a held lock refuses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from continuum_common.children import bound_to_parent, process_alive, process_start_ticks, spawn_options
from continuum_router.statelock import LOCK_FILE, StateDirBusy, StateLock, holding
from continuum_testing.up_process import children_of, kill_leftovers

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
# A process that started one of its own (a grandchild of the test), both sleeping.
_PARENT_OF_SLEEPER = [
    sys.executable, "-c",
    f"import subprocess, time; subprocess.Popen({_SLEEPER!r}); time.sleep(120)",
]  # fmt: skip


@pytest_asyncio.fixture(loop_scope="session")
async def spawn() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Start processes in sessions of their own, as `up` does; whatever survives the test is killed."""
    started: list[asyncio.subprocess.Process] = []
    yield started
    pids = [p.pid for p in started]
    pids += [c for pid in pids for c in children_of(pid)]
    kill_leftovers(pids)
    for proc in started:
        await proc.wait()


async def _start(spawn: list[asyncio.subprocess.Process], argv: list[str]) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(*bound_to_parent(argv), **spawn_options())
    spawn.append(proc)
    return proc


async def _dead_pid() -> int:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    return proc.pid


def _write_record(state: Path, pid: int, children: list[dict[str, object]]) -> None:
    state.mkdir(exist_ok=True)
    (state / LOCK_FILE).write_text(json.dumps({"pid": pid, "children": children}))


async def _wait_for_grandchild(pid: int) -> int:
    """The child `pid` started, once it runs the sleeper (past any wrapper)."""
    async with asyncio.timeout(10):
        while True:
            for child in children_of(pid):
                with contextlib.suppress(OSError):
                    if b"time.sleep(120)" in Path(f"/proc/{child}/cmdline").read_bytes():
                        return child
            await asyncio.sleep(0.02)


async def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + within
    while process_alive(pid):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_leftovers_of_a_dead_up_are_stopped_with_their_groups(
    tmp_path: Path, spawn: list[asyncio.subprocess.Process]
) -> None:
    leftover = await _start(spawn, _PARENT_OF_SLEEPER)
    grandchild = await _wait_for_grandchild(leftover.pid)
    # Same pid, but started at another time than recorded: a later process that reuses a pid.
    recycled = await _start(spawn, _SLEEPER)
    wrong_start = (process_start_ticks(recycled.pid) or 0) + 1
    _write_record(
        tmp_path,
        await _dead_pid(),
        [
            {"name": "nats-server", "pid": leftover.pid, "started": process_start_ticks(leftover.pid)},
            {"name": "simulated engines", "pid": recycled.pid, "started": wrong_start},
        ],
    )
    async with holding(tmp_path) as lock:
        assert not process_alive(leftover.pid)
        # Its whole process group: signalled with the leader, gone once the kernel has let it
        # exit (a moment later on a busy machine).
        assert await _gone(grandchild)
        assert process_alive(recycled.pid)
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record == {"pid": os.getpid(), "children": []}
        lock.add_child("nats-server", recycled.pid)
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["children"] == [
            {"name": "nats-server", "pid": recycled.pid, "started": process_start_ticks(recycled.pid)}
        ]
    assert not (tmp_path / LOCK_FILE).exists()


async def test_a_held_state_directory_is_refused_until_released(tmp_path: Path) -> None:
    first = StateLock(tmp_path)
    assert first.acquire() is None  # no file: nothing left behind
    try:
        with pytest.raises(StateDirBusy, match=rf"already running .* \(pid {os.getpid()}\)"):
            StateLock(tmp_path).acquire()
    finally:
        first.release()
    second = StateLock(tmp_path)
    assert second.acquire() is None  # a clean release leaves no record
    second.release()


async def test_children_get_sigterm_when_their_parent_is_killed(
    tmp_path: Path, spawn: list[asyncio.subprocess.Process]
) -> None:
    """bound_to_parent: a parent killed with SIGKILL takes its child with it."""
    script = (
        "import subprocess, time; from continuum_common.children import bound_to_parent; "
        f"subprocess.Popen(bound_to_parent({_SLEEPER!r})); time.sleep(120)"
    )
    parent = await _start(spawn, [sys.executable, "-c", script])
    child = await _wait_for_grandchild(parent.pid)
    parent.kill()
    await parent.wait()
    async with asyncio.timeout(10):
        while process_alive(child):
            await asyncio.sleep(0.02)
