"""The engine's clocks: the wall clock (real serving) and a virtual clock (the simulator's time).

The engine asks its clock for `now()` and, when idle, to `wait_until` an
arrival; a virtual clock is moved to the end of each step by the latency
model's prediction and jumps to arrivals, so a replay on it keeps the
simulator's time exactly. (A thread's CPU time, for profiling on a shared
CPU, is gpu_engine.host.ThreadCpuClock.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_SPIN_S = 0.002  # WallClock.wait_until busy-waits this long before its target


class WallClock:
    """Seconds since the clock was made, from the monotonic performance counter.

    `spin_s`: how much of each idle wait is spent spinning rather than asleep; inf keeps
    the core busy throughout (a sleeping virtual CPU runs the next tens of ms slower).
    """

    def __init__(self, spin_s: float = _SPIN_S) -> None:
        self._origin = time.perf_counter()
        self._spin_s = spin_s

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def wait_until(self, t_s: float) -> None:
        """Sleep, then spin the last stretch: a loaded machine wakes a sleeper milliseconds
        late, which would add to every idle arrival's TTFT (the simulator adds nothing)."""
        delay_s = t_s - self.now() - self._spin_s
        if delay_s > 0:
            time.sleep(delay_s)
        while self.now() < t_s:
            pass


@dataclass(slots=True)
class VirtualClock:
    """Time that moves only when told to: by a latency model's step time, or to an arrival."""

    t_s: float = 0.0

    def now(self) -> float:
        return self.t_s

    def wait_until(self, t_s: float) -> None:
        self.t_s = max(self.t_s, t_s)
