"""`continuum-indexer`: the KV index writer (JetStream -> Redis)."""

from __future__ import annotations

import sys


def main() -> int:
    print("continuum-indexer: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
