"""`continuum-kv-listener`: engine KV events -> NATS JetStream."""

from __future__ import annotations

import sys


def main() -> int:
    print("continuum-kv-listener: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
