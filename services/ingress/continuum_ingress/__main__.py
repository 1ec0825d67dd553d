"""`python -m continuum_ingress ARGS` runs `continuum-router ARGS`.

The command belongs to the launcher (continuum_router): `serve` composes the ingress with the KV
index feed it embeds, which is another service's code, and the ingress imports no other service.
This entry point hands over to the launcher by replacing this interpreter (exec: the same
process id, so signals and supervisors see one process), for scripts that start
`python -m continuum_ingress serve`.
"""

import os
import sys


def main() -> None:
    os.execv(sys.executable, [sys.executable, "-m", "continuum_router", *sys.argv[1:]])


if __name__ == "__main__":
    main()
