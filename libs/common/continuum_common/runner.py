"""The event loop every Continuum process runs on: uvloop where it is installed (a declared
dependency on POSIX), asyncio's default loop elsewhere; and the heap settings of a long-running
service: none of the cyclic collector while it imports its modules (`frozen_imports`), and
the settings it applies once it has started (`settle_heap`).

Why one place: a process that picks its own loop can end up on a different one from the same
code run elsewhere (the KV listener runs inside `continuum-router up` as well as on its own), and
then its timings and behaviour differ between the two. Every `__main__` calls `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# The cyclic collector's young-generation threshold once a service has started. Requests and
# batches in flight survive young collections, so at the default (700 allocations) the collector
# runs several times per request or engine batch; a larger threshold runs it less often for about
# the same work each.
GC_YOUNG_THRESHOLD = 10_000


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


def settle_heap() -> None:
    """After start-up: move everything allocated so far (modules, config, the service's long-lived
    containers) out of the collector's view and raise the young-generation threshold.

    Without it a full collection walks every long-lived object (~100k in a router; every entry of
    the KV listener's resident-block maps) and pauses the event loop for tens of milliseconds.
    Containers created before the call and filled later (a dict of resident blocks) stay out of
    the collector's view too: the collector never traverses a frozen object."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


@contextlib.contextmanager
def frozen_imports() -> Iterator[None]:
    """No cyclic garbage collection inside the block, and what it allocated moved out of the
    collector's view at its end (`gc.freeze()`, as `settle_heap` does later with the rest).

    For a service's imports: they allocate a few hundred thousand objects (module dicts,
    functions, classes, validation schemas) that all live as long as the process and are not
    garbage, but every allocation threshold crossed walks them again. In a router's start-up
    that walking was about a sixth of its imports' time, and merely re-enabling the collector
    afterwards cost one full collection of 35 ms (docs/benchmarks.md, "Start and stop"): time in
    which a restarted router is out of its load balancer. A cycle left unreachable by an import
    stays in memory, once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
