"""The event loop every Continuum process runs on: uvloop where it is installed (a declared
dependency on POSIX), asyncio's default loop elsewhere.

Why one place: each service's `__main__` used to choose its own loop, and the KV listener's
standalone process ended up on asyncio's selector loop while the same listener inside
`continuum-router up` ran on uvloop. uvloop's loop iteration and socket transports cost less
per wake-up, which matters most to the processes that wake for every engine batch (the
listener) or every streamed chunk (the ingress).
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
