"""`python -m continuum_ingress` = `continuum-router`."""

import sys

from continuum_ingress.cli import main

sys.exit(main())
