"""The request path's deadline (continuum_ingress/deadline.py) behaves as asyncio.timeout does."""

from __future__ import annotations

import asyncio

import pytest

from continuum_ingress.deadline import Deadline


def _task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    assert task is not None
    return task


async def test_a_passed_deadline_ends_the_section_in_timeout_error() -> None:
    task = _task()
    with pytest.raises(TimeoutError), Deadline(task, task.get_loop().time() + 0.01) as deadline:
        await asyncio.sleep(5)
    assert deadline.expired()
    assert task.cancelling() == 0  # our cancellation was withdrawn


async def test_expire_cuts_a_section_without_a_deadline() -> None:
    task = _task()
    deadline = Deadline(task, None)
    task.get_loop().call_later(0.01, deadline.expire)
    with pytest.raises(TimeoutError), deadline:
        await asyncio.sleep(5)
    assert task.cancelling() == 0


async def test_a_section_that_finishes_in_time_is_untouched() -> None:
    task = _task()
    with Deadline(task, task.get_loop().time() + 5) as deadline:
        await asyncio.sleep(0)
    deadline.expire()  # over: does nothing
    assert not deadline.expired()
    await asyncio.sleep(0.01)  # no late cancellation reaches the task
    assert task.cancelling() == 0


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def section() -> None:
        task = _task()
        with Deadline(task, task.get_loop().time() + 5):
            await asyncio.sleep(5)

    runner = asyncio.create_task(section())
    await asyncio.sleep(0.01)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner


async def test_both_cancelled_is_a_cancellation() -> None:
    """The deadline expired but the client also went away: the task must stay cancelled."""

    async def section() -> None:
        task = _task()
        deadline = Deadline(task, None)
        with deadline:
            deadline.expire()
            task.cancel()
            await asyncio.sleep(5)

    runner = asyncio.create_task(section())
    with pytest.raises(asyncio.CancelledError):
        await runner


async def test_an_error_inside_the_section_passes_through() -> None:
    task = _task()
    with pytest.raises(ValueError), Deadline(task, task.get_loop().time() + 5) as deadline:
        raise ValueError("not ours")
    assert not deadline.expired()
    await asyncio.sleep(0.01)
    assert task.cancelling() == 0


async def test_a_disarmed_deadline_neither_fires_nor_can_be_expired() -> None:
    task = _task()
    with Deadline(task, task.get_loop().time() + 0.02) as deadline:
        assert deadline.disarm()
        await asyncio.sleep(0.05)  # past the deadline: still running
        deadline.expire()  # the health checker's call: does nothing now
        await asyncio.sleep(0)
    assert not deadline.expired()
    assert task.cancelling() == 0


async def test_a_deadline_that_expired_cannot_be_disarmed() -> None:
    task = _task()
    deadline = Deadline(task, None)
    with pytest.raises(TimeoutError), deadline:
        deadline.expire()
        assert not deadline.disarm()
        await asyncio.sleep(5)
    assert deadline.expired()
