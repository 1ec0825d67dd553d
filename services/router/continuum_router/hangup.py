"""What a SIGHUP to `continuum-router up` means: "reload the configuration" or "your terminal is
gone".

Both arrive as the same signal. `kill -HUP <pid>` (or `systemctl reload`) is a reload request;
closing the terminal `up` runs in also sends SIGHUP, and then `up` must stop cleanly rather
than keep serving with nobody watching it (and, before its children had sessions of their own,
with its engines killed by the same hang-up: a router answering 503 to everything).

The rule (`TerminalWatch.lost()`): the terminal is gone when `up` had one at start and has it
no longer:

* it had a controlling terminal (`/dev/tty` opened) and now cannot open it - a hang-up detaches
  the terminal from every process of its session;
* one of stdin/stdout/stderr was a terminal and is not any more - a hung-up terminal fails
  every request on it;
* stdout or stderr is a pipe whose reader has gone (`up | tee up.log` after the terminal
  closed and took `tee` with it). Sockets are left out on purpose: under a service manager
  stdout is often a socket to the journal, and a SIGHUP there is always a reload request.

Otherwise the SIGHUP is a reload. A process started under `nohup` (SIGHUP ignored when `up`
starts) asked to outlive its terminal: there every SIGHUP is a reload.
"""

from __future__ import annotations

import os
import select
import signal
import stat
from collections.abc import Sequence

_STD_FDS = (0, 1, 2)
_OUTPUT_FDS = (1, 2)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _has_controlling_terminal() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _reader_gone(fd: int) -> bool:
    """A pipe whose read end is closed polls as an error."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return True
    return any(mask & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, mask in events)


class TerminalWatch:
    """Built at start (what `up` is attached to), asked on every SIGHUP. `std_fds` and
    `output_fds`: the descriptors to look at (stdin/stdout/stderr and stdout/stderr)."""

    def __init__(self, std_fds: Sequence[int] = _STD_FDS, output_fds: Sequence[int] = _OUTPUT_FDS) -> None:
        self.hangups_ignored = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        self.controlling = _has_controlling_terminal()
        self.tty_fds = [fd for fd in std_fds if _isatty(fd)]
        self.pipe_fds = [fd for fd in output_fds if _is_pipe(fd)]

    def lost(self) -> bool:
        if self.hangups_ignored:
            return False
        if self.controlling and not _has_controlling_terminal():
            return True
        if any(not _isatty(fd) for fd in self.tty_fds):
            return True
        return any(_reader_gone(fd) for fd in self.pipe_fds)


def detach_std_streams(output: str | os.PathLike[str] | None = None) -> None:
    """Point stdin at /dev/null and stdout/stderr at `output` (appended; /dev/null when None or
    when it cannot be opened): after the terminal is gone, writes to it fail, and the
    shutdown's log lines (and the interpreter's final flush) must not. A file keeps what the
    shutdown says, an error included, for the operator who closed the terminal."""
    null = os.open(os.devnull, os.O_RDWR)
    out = null
    if output is not None:
        try:
            out = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            out = null
    try:
        os.dup2(null, 0)
        for fd in _OUTPUT_FDS:
            os.dup2(out, fd)
    finally:
        if out != null:
            os.close(out)
        os.close(null)
