"""Child processes that do not outlive the process that started them.

`continuum-router up` and the test harness start real servers (nats-server, redis-server, the
simulated engines). Two things make those children go away with their parent, even when the
parent is killed with SIGKILL and runs no clean-up code:

* **A parent-death signal.** On Linux every child is started through this file run as a tiny
  wrapper (`python -I -S children.py PARENT_PID SIGNAL -- ARGV...`): the wrapper asks the kernel
  for PR_SET_PDEATHSIG, checks that its parent is still the process that started it (else the
  parent died before the request took effect, and the wrapper exits), then `execv`s the real
  program. The setting survives `execv` (not for set-uid binaries, which these are not), so the
  real program gets the signal the moment its parent dies.

  Why a wrapper and not `preexec_fn`: `preexec_fn` runs Python code between `fork` and `exec`
  in a process that may have other threads (libzmq's I/O threads, exporters, the default
  executor); a lock one of them held at fork time (malloc's, the import lock) stays held
  forever in the child, which can deadlock it. The wrapper runs after `exec`, as a fresh
  single-threaded interpreter (`-I -S`: no site-packages, no environment, ~10 ms), so it cannot
  inherit a held lock.

  The kernel sends the signal when the *thread* that forked the child exits. Every child here
  is spawned from the event loop's thread, which lives as long as the process; do not spawn
  one from a worker thread.

* **A session of its own** (`start_new_session=True`). A terminal's Ctrl-C and hang-up reach the
  terminal's foreground process group. Children outside it are told to stop by their parent, in
  order, after the parent has decided what the signal means (`up` treats SIGHUP as a reload
  unless its terminal is gone), instead of each one reacting on its own: nats-server would
  reload its configuration on SIGHUP, the simulated engines would die. A child that leads its
  own process group can also be stopped together with anything it started
  (`os.killpg(pid, ...)`).

Elsewhere than Linux there is no parent-death signal; the child is started directly.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# <linux/prctl.h>
_PR_SET_PDEATHSIG = 1


def parent_death_supported() -> bool:
    return sys.platform.startswith("linux")


def bound_to_parent(argv: Sequence[str], sig: int = signal.SIGTERM) -> list[str]:
    """`argv` as a command that receives `sig` when the calling process dies (Linux), else
    `argv` unchanged. SIGTERM by default: the children stop cleanly (nats-server closes its
    JetStream store) and none of them ignores it."""
    if not parent_death_supported():
        return list(argv)
    wrapper = str(Path(__file__).resolve())
    return [sys.executable, "-I", "-S", wrapper, str(os.getpid()), str(int(sig)), "--", *argv]


def spawn_options() -> dict[str, Any]:
    """Keyword arguments for `asyncio.create_subprocess_exec` / `subprocess.Popen` that put the
    child in a session (and process group) of its own."""
    return {"start_new_session": True}


def process_start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (Linux, /proc/PID/stat field 22): with the
    pid it names one process for good, so a recorded child is not confused with a later process
    that reuses its pid. None when unknown (no /proc, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return int(fields[19])  # field 22; fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """True while `pid` runs. A zombie (dead, not yet reaped by its parent) is not alive."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass  # no /proc: ask the kernel
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _set_parent_death_signal(sig: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _wrapper_main(args: list[str]) -> int:
    """PARENT_PID SIGNAL -- ARGV...: never returns on success (execv)."""
    if len(args) < 4 or args[2] != "--":
        print("usage: children.py PARENT_PID SIGNAL -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    parent, sig, argv = int(args[0]), int(args[1]), args[3:]
    _set_parent_death_signal(sig)
    if os.getppid() != parent:
        return 1  # the parent is already gone: it will never ask this child to stop
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"error: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(_wrapper_main(sys.argv[1:]))
