"""An autouse fixture for the suites that open real sockets (integration, e2e).

A client left to the garbage collector (an SDK or httpx client nobody closed) closes its
socket when collected and then, from a callback its finalizer schedules, aborts the transport,
which unregisters the file descriptor *number* from the event loop. If another socket has
reused that number in the meantime (the suites share one loop and open sockets all the time),
that socket silently stops being polled: seen as a simulated engine that never accepted again
and a test that hung until its timeout. Every test closes what it opens; this guard makes a
miss harmless by collecting right after each test and letting the scheduled callbacks run
before the next test opens anything.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest_asyncio


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def _collect_leaked_clients() -> AsyncIterator[None]:
    yield
    gc.collect()
    for _ in range(3):  # finalizers schedule with call_soon; a few ticks run them
        await asyncio.sleep(0)
