"""The event loop every Continuum process runs on: uvloop where it is installed (a declared
dependency on POSIX), asyncio's default loop elsewhere.

Why one place: a process that picks its own loop can end up on a different one from the same
code run elsewhere (the KV listener runs inside `continuum-router up` as well as on its own), and
then its timings and behaviour differ between the two. Every `__main__` calls `run`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None (asyncio's default) where uvloop is unavailable."""
    if sys.platform == "win32":
        return None
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a new loop from `loop_factory()`."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
