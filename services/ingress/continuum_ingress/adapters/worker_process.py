"""One worker process of a `serve` supervisor (supervisor.py): started so it dies with the
supervisor (continuum_common.children: SIGTERM when the supervisor dies, in a session of its own
so a terminal's signals reach only the supervisor), its stdout read for the two lines a worker
writes there: `continuum-router listening on URL` once it serves, or `error: ...` when it cannot
start. Its log (stderr) goes where the supervisor's goes."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Sequence

from continuum_common.children import bound_to_parent, spawn_options

READY_MARK = "listening on "
ERROR_MARK = "error: "


class WorkerProcess:
    def __init__(self, index: int, argv: Sequence[str], on_ready: Callable[[WorkerProcess], None]) -> None:
        self.index = index
        self.argv = list(argv)
        self.on_ready = on_ready
        self.ready = False
        self.error: str | None = None  # the worker's own start-up error line, without "error: "
        self.started_at = 0.0
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *bound_to_parent(self.argv, signal.SIGTERM),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            **spawn_options(),
        )
        self.started_at = time.monotonic()
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"worker-{self.index}-stdout")

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            text = line.decode("utf-8", "replace").strip()
            if not self.ready and READY_MARK in text:
                self.ready = True
                self.on_ready(self)
            elif text.startswith(ERROR_MARK) and self.error is None:
                self.error = text[len(ERROR_MARK) :]

    async def wait(self) -> int:
        assert self._proc is not None
        code = await self._proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader
        return code

    def send(self, sig: int) -> None:
        if self.running:
            assert self._proc is not None
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    def ran_for(self) -> float:
        return time.monotonic() - self.started_at


def describe_exit(code: int) -> str:
    """`code 1` or `signal SIGKILL` (a negative return code is the signal that ended it)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
