"""`python -m continuum_router` = `continuum-router`."""

import sys

from continuum_router.cli import main

if __name__ == "__main__":
    sys.exit(main())
