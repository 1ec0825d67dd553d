"""`continuum-sim-engine` / `python -m continuum_sim`."""

from __future__ import annotations

import sys

from continuum_sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
