"""Fault drills against a whole stack of real processes (bench/continuum_bench/procstack.py). Each drill prints
one line of what it lost to the terminal, pass or fail."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from continuum_bench.procstack import ProcessStack, StackOptions
from continuum_testing.leak_guard import _collect_leaked_clients

__all__ = ["_collect_leaked_clients"]

Report = Callable[[str], None]


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Report:
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")

    def write(line: str) -> None:
        if terminal is not None:
            terminal.write_line(f"\n[fault drill] {line}")

    return write


@pytest.fixture(scope="module")
async def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ProcessStack]:
    """One stack with the default options for every drill that needs no options of its own:
    starting nine processes costs more than most drills, and each drill leaves the stack whole."""
    async with ProcessStack(tmp_path_factory.mktemp("shared-stack"), StackOptions()) as stack:
        yield stack


@pytest.fixture
async def stack(shared_stack: ProcessStack) -> ProcessStack:
    """The shared stack, whole again (a failed drill may have left a part stopped) and with its
    index converged on the engines before the drill starts."""
    await shared_stack.restore()
    await shared_stack.converged(20.0)
    return shared_stack


@pytest.fixture
async def make_stack(tmp_path: Path) -> AsyncIterator[Callable[..., ProcessStack]]:
    stacks: list[ProcessStack] = []

    def make(**options: object) -> ProcessStack:
        stack = ProcessStack(tmp_path / f"stack{len(stacks)}", StackOptions(**options))  # type: ignore[arg-type]
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        await stack.close()
