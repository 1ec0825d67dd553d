"""A deadline over one section of a request's task, cheaper than `asyncio.timeout`.

`asyncio.timeout()` looks the running loop and the current task up on every use, and on the
Python versions this runs on each lookup is a `getpid()` system call (the loop checks that it
was not inherited across a fork). The request path already knows its task, so the deadline is
built from it. The semantics are `asyncio.Timeout`'s: when the deadline passes (or `expire()` is
called) the task is cancelled, and the section ends in `TimeoutError` instead of
`CancelledError` unless someone else also cancelled the task.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any


class Deadline:
    """Use as `with Deadline(task, when):` inside `task`; `when` is a loop time or None (no
    deadline, but `expire()` still cuts the section short)."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_inside", "_task", "_when")

    def __init__(self, task: asyncio.Task[Any], when: float | None) -> None:
        self._task = task
        self._when = when
        self._handle: asyncio.TimerHandle | None = None
        self._expired = False
        self._inside = False
        self._cancelling = 0

    def __enter__(self) -> Deadline:
        self._inside = True
        self._cancelling = self._task.cancelling()  # cancellations already pending are not ours
        if self._when is not None:
            self._handle = self._task.get_loop().call_at(self._when, self.expire)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._inside = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # Our cancellation is withdrawn whatever the section ended with; it becomes a
        # TimeoutError only when it is what ended the section and nobody else cancelled since
        # the section began.
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def expire(self) -> None:
        """End the section now (from outside the task: the health checker takes the backend
        out of rotation). Does nothing once the section is over or already expired."""
        if self._inside and not self._expired:
            self._expired = True
            self._task.cancel()

    def disarm(self) -> bool:
        """Make the rest of the section safe from the deadline (what it waited for has come,
        and something already acted on it). False, with nothing changed, once it expired."""
        if self._expired:
            return False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._inside = False  # expire() does nothing from here on
        return True

    def expired(self) -> bool:
        return self._expired
