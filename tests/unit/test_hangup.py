"""hangup.TerminalWatch on real descriptors: a hung-up terminal and a pipe without a reader
mean "the terminal is gone"; anything else, and everything under nohup, means "reload"."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from continuum_router.hangup import TerminalWatch


class Pipe:
    def __init__(self) -> None:
        self.read, self.write = os.pipe()

    def close_read(self) -> None:
        os.close(self.read)
        self.read = -1

    def close(self) -> None:
        for fd in (self.read, self.write):
            if fd >= 0:
                os.close(fd)


@pytest.fixture(autouse=True)
def sighup_default() -> Iterator[None]:
    """Each test starts with SIGHUP's default disposition, whatever the runner inherited (a
    suite started under nohup ignores SIGHUP, which TerminalWatch rightly reads as "never
    lost")."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    made = Pipe()
    yield made
    made.close()


def test_a_hung_up_terminal_is_lost() -> None:
    master, slave = os.openpty()
    try:
        watch = TerminalWatch(std_fds=(slave,), output_fds=(slave,))
        assert watch.tty_fds == [slave]
        assert not watch.lost()
        os.close(master)  # the terminal emulator went away
        assert watch.lost()
    finally:
        os.close(slave)


def test_output_to_a_pipe_without_reader_is_lost(pipe: Pipe) -> None:
    watch = TerminalWatch(std_fds=(), output_fds=(pipe.write,))
    assert not watch.lost()
    pipe.close_read()  # `up | tee log`: tee died with the terminal
    assert watch.lost()


def test_files_and_sockets_are_never_a_lost_terminal(tmp_path: Path) -> None:
    """Output to a file, or to a socket (a service manager's journal) whose peer has gone."""
    ours, peer = socket.socketpair()
    with (tmp_path / "log").open("w") as log, ours, peer:
        watch = TerminalWatch(std_fds=(log.fileno(), ours.fileno()), output_fds=(log.fileno(), ours.fileno()))
        assert (watch.tty_fds, watch.pipe_fds) == ([], [])
        peer.close()
        assert not watch.lost()


def test_under_nohup_every_sighup_is_a_reload(pipe: Pipe) -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        watch = TerminalWatch(std_fds=(), output_fds=(pipe.write,))
    finally:
        signal.signal(signal.SIGHUP, previous)
    pipe.close_read()
    assert watch.hangups_ignored
    assert not watch.lost()


_DETACH = (
    "import sys; from continuum_router.hangup import detach_std_streams; "
    "detach_std_streams(sys.argv[1] or None); print('out'); print('err', file=sys.stderr); "
    "print(repr(sys.stdin.read()))"
)


@pytest.mark.parametrize("to_file", [True, False])
def test_detached_streams_write_to_the_file_or_nowhere(tmp_path: Path, to_file: bool) -> None:
    """After a lost terminal stdout and stderr go to the given file (appended), stdin reads
    nothing; without a file, or with one that cannot be opened, everything goes to /dev/null
    and writing still succeeds."""
    import subprocess
    import sys

    target = tmp_path / "after.log"
    target.write_text("before\n")
    given = str(target) if to_file else str(tmp_path / "no-such-dir" / "after.log")
    done = subprocess.run(
        [sys.executable, "-c", _DETACH, given], input=b"typed", capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"" and done.stderr == b""
    expected = "before\nout\nerr\n''\n" if to_file else "before\n"
    assert target.read_text() == expected
