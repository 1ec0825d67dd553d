"""`continuum-gemini-cache`: Gemini cachedContents lifecycle service."""

from __future__ import annotations

import sys


def main() -> int:
    print("continuum-gemini-cache: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
