import sys

from continuum_bench.fleet.cli import main

sys.exit(main())
