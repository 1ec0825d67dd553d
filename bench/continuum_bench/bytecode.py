"""Continuum's modules byte-compiled before a benchmark starts its processes.

An installed Continuum has its bytecode beside its sources: pip compiles every module when it
installs a wheel (the container image does so too). A source checkout installed in editable
mode has none until a process writes it, and with `PYTHONDONTWRITEBYTECODE` set (as on the
machines these benchmarks ran on) no process ever does, so every start of every service
compiles about 200 modules again: 125 ms of a router's start (docs/benchmarks.md, "Start and
stop"). The peers' packages are installed wheels, so a restart comparison would charge
Continuum alone with it. The benchmarks that start or restart Continuum's processes call
`compile_packages` (this checkout) or `compile_tree` (another checkout, `--baseline`) first.
"""

from __future__ import annotations

import compileall
import importlib.util
from pathlib import Path

PACKAGES = (
    "continuum_common",
    "continuum_router",
    "continuum_ingress",
    "continuum_indexer",
    "continuum_listener",
    "continuum_gemini_cache",
    "continuum_sim",
)
# Where the packages live in a checkout (the setuptools package-dir mapping of pyproject.toml).
SOURCE_DIRS = ("libs", "services")


def compile_packages() -> None:
    """Write the missing or stale bytecode of every Continuum package this interpreter imports.
    A package installed where this user cannot write is left as it is (quietly)."""
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        for directory in (spec.submodule_search_locations or []) if spec is not None else []:
            compileall.compile_dir(directory, quiet=2)


def compile_tree(checkout: Path) -> None:
    """The same for the sources of another checkout."""
    for part in SOURCE_DIRS:
        compileall.compile_dir(checkout / part, quiet=2)
