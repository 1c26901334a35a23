"""A run's progress bar, which costs nothing until the run has lasted long enough to want one.

Why: most runs (a quickstart, every task of a sweep) end in well under the
two seconds a bar waits before it shows, yet importing tqdm (with the logging
module it loads) and opening a bar (a multiprocessing lock) weigh ~7 ms of a
short process. So tqdm loads only when the first update comes after the
delay, and its bar then starts from the count so far, with the run's own
start time, so its rate and elapsed time are the run's.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any


class DelayedBar:
    """`update(n)` counts; after `delay_s` of wall time the next update opens a tqdm bar.

    Used as a context manager, like tqdm: leaving it closes the bar, if one opened.
    """

    def __init__(self, total: int | None, desc: str, unit: str, delay_s: float = 2.0,
                 enabled: bool = True) -> None:
        self._total, self._desc, self._unit = total, desc, unit
        self._delay_s, self._enabled = delay_s, enabled
        self._started_s = time.perf_counter()
        self._done = 0
        self._bar: Any = None  # a tqdm bar, once opened

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)
            return
        self._done += n
        elapsed_s = time.perf_counter() - self._started_s
        if self._enabled and elapsed_s >= self._delay_s:
            from tqdm import tqdm

            # shown at this first update, with the run's elapsed time and rate
            bar = tqdm(total=self._total, unit=self._unit, desc=self._desc, delay=self._delay_s)
            bar.start_t -= elapsed_s
            bar.last_print_t -= elapsed_s
            bar.update(self._done)
            self._bar = bar

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> DelayedBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
