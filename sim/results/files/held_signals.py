"""Ctrl-C and SIGTERM held off while a few file operations must finish together.

Why: a result directory's staging, swap and clean-up (sim.results.files.output_dir) and the
start-up's signal handling must not be cut in half by an interrupt; the interrupt is
delivered, just after the block.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends (main thread; elsewhere nothing).

    The handlers are swapped for one that only notes the signal, and a noted signal is
    raised again once the old handlers are back. Blocking the signals with
    `pthread_sigmask` would not do: it masks the main thread only, so with any other
    thread alive (a progress bar's monitor, a pool's manager) the kernel hands the
    signal to that thread and Python raises KeyboardInterrupt in the main thread
    inside the block anyway.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    kinds = (signal.SIGINT, signal.SIGTERM)
    old = {kind: signal.getsignal(kind) for kind in kinds}
    for kind in kinds:
        if old[kind] is not None:  # None: a handler not set from Python; leave it be
            signal.signal(kind, lambda signum, _frame: noted.append(signum))
    try:
        yield
    finally:
        for kind in kinds:
            if old[kind] is not None:
                signal.signal(kind, old[kind])
        for signum in noted:
            signal.raise_signal(signum)
