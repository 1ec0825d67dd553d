"""How late the event loop runs what is due: a timer set `interval_s` ahead fires that much
later than asked when something else holds the loop (a long callback, a collection, another
process on the same core). The lateness of a periodic timer is what a request arriving at a
random moment waits before the loop reads it, so services export it as a histogram.

`measure_loop_lag(observe, stop, interval_s)` runs until `stop` is set, calling `observe(lag)`
once per tick. One timer per tick: at the default 0.1 s it costs a few microseconds of CPU a
second. The lag is measured on the loop's own clock (`loop.time()`), which the timer uses too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Final

DEFAULT_INTERVAL_S = 0.1
# Histogram bounds (seconds) every service exports its lag with, so dashboards compare them.
LAG_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


async def measure_loop_lag(
    observe: Callable[[float], None], stop: asyncio.Event, interval_s: float = DEFAULT_INTERVAL_S
) -> None:
    """Until `stop` is set: sleep `interval_s` and observe how much later than that the loop
    came back (never negative)."""
    if interval_s <= 0:
        raise ValueError("the loop-lag interval must be positive")
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + interval_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        if stop.is_set():
            return
        observe(max(0.0, loop.time() - due))
