"""Fleet benchmark: `continuum-router bench fleet` / `python -m continuum_bench.fleet` (see bench/continuum_bench/fleet/cli.py)."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    # Imported on call so `python -m continuum_bench.fleet.trace` does not pre-import its own module.
    from continuum_bench.fleet.cli import main as run

    return run(argv)
