"""The `servesim` process's start-up, kept short: no garbage collections, no plugin scan,
one BLAS thread.

Why: before a command does its work it imports numpy, pydantic, simpy and a
couple of hundred modules and builds the scenario schema, some 100k objects
that live as long as the process. Left on, the cyclic collector walks them
over and over while they load (about 170 collections before a quickstart run
starts) and again on the way out: a tenth of a 1k-request run's CPU. And the
first pydantic model looks for pydantic plugins in the entry points of every
installed distribution (~10 ms in a full environment), though servesim's
schema has no use for one. And numpy's OpenBLAS starts a thread per core as
it loads, which spin a while before they sleep: ~30 ms of CPU of a quickstart
run on a two-core machine. Nothing in servesim calls BLAS on arrays large
enough to use them (its vectors are a running set's), and its parallel work
runs in processes (joblib), so one thread is all it wants.

`begin()` turns all three off for the process (the console script, `python -m
sim.cli`), keeping a PYDANTIC_DISABLE_PLUGINS or OPENBLAS_NUM_THREADS of the
user's own; `started()` then freezes what exists out of every later collection
(`gc.freeze`) and turns the collector back on, so the work itself is
collected as usual.
"""

from __future__ import annotations

import gc
import os


def begin() -> None:
    """No collections until `started()`; no pydantic plugins; one OpenBLAS thread (before
    numpy loads: it reads the variable then). The user's own settings of either are kept."""
    gc.disable()
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def started() -> None:
    """Start-up is over: freeze what it built out of later collections; collect again.

    Only where `begin()` turned the collector off: an in-process caller of
    `sim.cli.main` (the tests) keeps its collector, and its objects, as they were.
    And numpy.random is loaded now, where a Ctrl-C cannot be lost (_load_numpy_random).
    """
    _load_numpy_random()
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _load_numpy_random() -> None:
    """Import numpy.random with Ctrl-C held until it is in (then raised as usual).

    Every run draws from it, and numpy loads it on first use, so it used to load
    once the run had begun. Its Cython modules register with collections.abc as
    they load and drop any error raised meanwhile, a KeyboardInterrupt too: a
    Ctrl-C landing there was lost and the run went on (1 run in 4-12 in
    tests/test_cli_signals.py, interrupted as soon as its staging directory exists).
    """
    from sim.results.files.output_dir import signals_held

    with signals_held():
        import numpy.random  # noqa: F401


def leaving() -> None:
    """The command is done: the interpreter's last collections need not walk its objects."""
    gc.freeze()
