"""The `servesim` process's start-up, kept out of the cyclic garbage collector's way.

Why: before a command does its work it imports numpy, pydantic, simpy and a
couple of hundred modules and builds the scenario schema, some 100k objects
that live as long as the process. Left on, the collector walks them over and
over while they load (about 170 collections before a quickstart run starts)
and again on the way out, a tenth of a 1k-request run's CPU. `hold()` turns
it off for the start-up of the process (the console script, `python -m
sim.cli`); `started()` then freezes what exists out of every later collection
(`gc.freeze`) and turns it back on, so the work itself is collected as usual.
"""

from __future__ import annotations

import gc


def hold() -> None:
    """No collections until `started()`: the process's start-up only allocates."""
    gc.disable()


def started() -> None:
    """Start-up is over: freeze what it built out of later collections; collect again.

    Only where `hold()` turned the collector off: an in-process caller of
    `sim.cli.main` (the tests) keeps its collector, and its objects, as they were.
    """
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def leaving() -> None:
    """The command is done: the interpreter's last collections need not walk its objects."""
    gc.freeze()
