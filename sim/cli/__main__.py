"""`python -m sim.cli ...`: the same as the `servesim` console script."""

from sim.cli import console

console()
