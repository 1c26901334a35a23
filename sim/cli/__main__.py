"""`python -m sim.cli ...`: the same as the `servesim` console script."""

import sys

from sim.cli import main

sys.exit(main())
