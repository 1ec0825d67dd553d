"""The event-loop lag probe on a real event loop: a callback that holds the loop shows as lag,
the probe stops when asked, and a non-positive interval is refused."""

from __future__ import annotations

import asyncio
import time

import pytest

from continuum_common.loop_lag import measure_loop_lag


async def test_a_callback_holding_the_loop_shows_as_lag() -> None:
    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(measure_loop_lag(lags.append, stop, interval_s=0.01))
    await asyncio.sleep(0.035)
    time.sleep(0.08)  # holds the loop, as a long callback would
    await asyncio.sleep(0.03)
    stop.set()
    await asyncio.wait_for(probe, 1)
    assert lags and all(lag >= 0 for lag in lags)
    assert max(lags) >= 0.06  # the tick due during the hold ran at least that late


async def test_the_probe_returns_soon_after_stop_without_observing() -> None:
    lags: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(measure_loop_lag(lags.append, stop, interval_s=30))
    await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(probe, 1)  # not after the 30-s tick
    assert lags == []


async def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        await measure_loop_lag(lambda _: None, asyncio.Event(), interval_s=0)
