"""How often code under test gives the event loop to others: for tests of work that must not
hold the loop (a `/metrics` exposition, a sibling's metrics parsed)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def turns_during(awaitable: Awaitable[T]) -> tuple[T, int]:
    """Await `awaitable`; return its result and the turns another task got meanwhile."""
    turns = 0
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker now waits for its next turn
    start = turns
    try:
        result = await awaitable
    finally:
        done = True
        await task
    return result, turns - start
