"""Ctrl-C is never lost: an interrupt that some code swallowed is raised again until it lands.

Why: Python raises KeyboardInterrupt wherever the main thread happens to be when
SIGINT arrives, and some places drop any exception raised in them: a finaliser
(`__del__`, a generator closed as it is freed, a weakref callback: Python prints
"Exception ignored" and goes on), or C code that clears errors (numpy.random's
Cython modules as they register with collections.abc; sim.cli.start_up holds
Ctrl-C while they load). A KeyboardInterrupt raised there is lost and a long
run goes on after the user pressed Ctrl-C (rarely: tests/test_cli_signals.py
saw it twice on a loaded machine).

So the `servesim` process's SIGINT handler raises KeyboardInterrupt as Python's
does, and also starts a repeating timer of one second of the process's CPU time
(ITIMER_VIRTUAL: only a process that goes on working reaches it, and no other
part of servesim uses that timer): its SIGVTALRM raises KeyboardInterrupt again
unless one is being handled already (the command is stopping: its clean-up is
left alone). The command stops the timer where it takes the interrupt (`stop`).
And an interrupt dropped where Python reports what it drops (a weakref callback, a
finaliser: "Exception ignored in ...", with its traceback) is dropped quietly: the
timer raises it again, and the user sees the one line `interrupted`, not a traceback
from wherever the Ctrl-C happened to land (an import lock's callback, under load).
Only the console script installs it (`install`): an in-process caller of
`sim.cli.main` keeps its own handlers. Without the timer (Windows) a Ctrl-C is
Python's own.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

RETRY_CPU_S = 1.0  # CPU seconds between raises of a Ctrl-C the command has not taken


def install() -> None:
    """Take over SIGINT, unless it is ignored (a background job) or has a handler of its own."""
    if not hasattr(signal, "setitimer") or signal.getsignal(signal.SIGINT) is not (
            signal.default_int_handler):
        return
    signal.signal(signal.SIGVTALRM, _again)
    signal.signal(signal.SIGINT, _interrupted)
    sys.unraisablehook = _quiet_interrupts(sys.unraisablehook)


def stop() -> None:
    """The interrupt was taken (or the command is over): no more raises."""
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    signal.setitimer(signal.ITIMER_VIRTUAL, RETRY_CPU_S, RETRY_CPU_S)
    raise KeyboardInterrupt


def _again(signum: int, frame: FrameType | None) -> None:
    if not caused_by_interrupt(sys.exc_info()[1]):  # none is being handled
        raise KeyboardInterrupt


def _quiet_interrupts(report: Callable[[Any], object]) -> Callable[[Any], None]:
    """sys.unraisablehook that drops a KeyboardInterrupt (raised again by the timer) and
    hands anything else to `report`, the hook it replaces."""
    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            report(unraisable)
    return hook


def caused_by_interrupt(err: BaseException | None) -> bool:
    """Whether `err` is a KeyboardInterrupt or was raised while handling one: a library that
    is interrupted in its own clean-up (joblib starting its pool) raises its error from it."""
    seen = err
    for _ in range(16):  # a chain is short; a cycle cannot hang the handler
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
