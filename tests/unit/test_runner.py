"""continuum_common.runner: the one loop choice every process makes."""

from __future__ import annotations

import asyncio
import sys

import pytest

from continuum_common.runner import loop_factory, run


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is a dependency on POSIX only")
def test_processes_run_on_uvloop_where_it_is_installed() -> None:
    assert loop_factory() is not None
    assert run(_loop_module()).startswith("uvloop")


def test_run_returns_what_the_coroutine_returns() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run(answer()) == 42
