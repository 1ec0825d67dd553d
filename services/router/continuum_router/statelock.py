"""`.continuum/up.lock`: one `continuum-router up` per state directory, and what it started.

The running `up` holds an exclusive `flock` on the file for its whole life and keeps its own pid
and its child processes (nats-server, the simulated engines) in it as JSON. The kernel drops
the lock when the process dies, however it dies, so:

* a second `up` on the same directory finds the lock held and stops with one line naming the
  running one, instead of starting a second nats-server on the same JetStream store;
* an `up` that finds the file but not the lock knows the last one died without cleaning up.
  Its children normally died with it (they get SIGTERM when their parent dies, see
  continuum_common.children); any that still run are stopped now, their process groups first
  with SIGTERM, then SIGKILL. A recorded pid is only signalled while it still names the same
  process (its start time in /proc matches the record), never a later process that reuses it.

A clean stop deletes the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from continuum_common.children import process_alive, process_start_ticks
from continuum_ingress.errors import IngressError

log = logging.getLogger("continuum.up")

LOCK_FILE = "up.lock"
LEFTOVER_GRACE_S = 5.0


class StateDirBusy(IngressError):
    """Another `up` holds the state directory."""


@dataclass(frozen=True)
class ChildRecord:
    name: str
    pid: int
    # process_start_ticks(pid) when it was recorded; None where /proc is not available.
    started: int | None = None

    def is_running(self) -> bool:
        """Still the process that was recorded (not a later one with the same pid)."""
        if not process_alive(self.pid):
            return False
        if self.started is not None:
            return process_start_ticks(self.pid) == self.started
        # No start time to compare: signal only a process that leads its own group, as every
        # child of `up` does (it was started in a session of its own).
        try:
            return os.getpgid(self.pid) == self.pid
        except OSError:
            return False


@dataclass(frozen=True)
class UpRecord:
    pid: int
    children: list[ChildRecord] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> UpRecord | None:
        """None for an empty or unreadable file (a writer was interrupted): nothing to act on."""
        try:
            data: Any = json.loads(text)
            children = [ChildRecord(str(c["name"]), int(c["pid"]), c.get("started")) for c in data["children"]]
            return cls(int(data["pid"]), children)
        except (ValueError, KeyError, TypeError):
            return None


def _read(fd: int) -> UpRecord | None:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return UpRecord.from_json(b"".join(chunks).decode("utf-8", errors="replace"))


class StateLock:
    """The lock of one state directory. `acquire()` returns the record a dead `up` left behind
    (None after a clean stop) or raises StateDirBusy; `add_child()` records a child process."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None
        self._record = UpRecord(os.getpid())

    def acquire(self) -> UpRecord | None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                pid = f"pid {holder.pid}" if holder is not None else "pid unknown"
                raise StateDirBusy(
                    f"continuum-router up is already running with the state directory "
                    f"{self.state_dir.resolve()} ({pid}); stop it first, or start this one in another directory"
                ) from None
            # The owner deletes the file when it stops: if it did so between our open and our
            # lock, we hold a lock on a file nobody else will find. Start over on the new one.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)
        self._fd = fd
        previous = _read(fd)
        self._write()
        return previous

    def add_child(self, name: str, pid: int | None) -> None:
        if pid is None:
            return
        child = ChildRecord(name, pid, process_start_ticks(pid))
        self._record = UpRecord(self._record.pid, [*self._record.children, child])
        self._write()

    def _write(self) -> None:
        assert self._fd is not None
        data = self._record.to_json().encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                self.path.unlink()
        os.close(fd)  # drops the flock


async def stop_leftovers(record: UpRecord, grace: float = LEFTOVER_GRACE_S) -> list[ChildRecord]:
    """Stop the children of a dead `up` that still run (their whole process groups): SIGTERM,
    then SIGKILL after `grace` seconds. Returns the ones that were running."""
    running = [c for c in record.children if c.is_running()]
    for child in running:
        _signal_group(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not any(process_alive(c.pid) for c in running):
            break
        await asyncio.sleep(0.05)
    for child in running:
        if process_alive(child.pid):
            _signal_group(child.pid, signal.SIGKILL)
    return running


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        log.warning("cannot signal process group %d (another user's process)", pid)
        return


@contextlib.asynccontextmanager
async def holding(state_dir: Path) -> AsyncIterator[StateLock]:
    """Hold `state_dir` for one `up`: refuse when another holds it, clean up after a dead one."""
    lock = StateLock(state_dir)
    previous = lock.acquire()
    try:
        if previous is not None:
            stopped = await stop_leftovers(previous)
            names = ", ".join(f"{c.name} (pid {c.pid})" for c in stopped) or "none still running"
            log.warning(
                "the previous up (pid %d) did not stop cleanly; its leftover processes: %s", previous.pid, names
            )
        yield lock
    finally:
        lock.release()
