"""`continuum-sim-engine`: a simulated vLLM engine."""

from __future__ import annotations

import sys


def main() -> int:
    print("continuum-sim-engine: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
