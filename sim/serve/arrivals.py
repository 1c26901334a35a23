"""Arrival instants for the serving loop, by sim.core.drive's rules.

An HTTP arrival is stamped on the server's clock when its headers are in. The
scheduler must get the instant a simulation of the served log would give it, so
that replaying that log makes the very same plans (tests/test_serve.py):
- stamps never go back: a request whose body was read faster than its
  predecessor's takes that one's stamp, so a replay sorted by arrival keeps the order;
- the scheduler gets the previous arrival's instant plus the gap, as drive and
  SimPy add it (the float sum, not the stamp itself);
- never at or before an instant the loop has already admitted up to.
"""

from __future__ import annotations

import math


class ArrivalClock:
    """The last arrival's stamp and instant, and how far the loop has admitted."""

    __slots__ = ("admitted_s", "last_arrival_s", "last_raw_s")

    def __init__(self) -> None:
        self.last_arrival_s = 0.0  # the last arrival's instant, as drive accumulates them
        self.last_raw_s = 0.0  # and its stamp
        self.admitted_s = -math.inf  # arrivals up to here have been added

    def stamp(self, raw_s: float) -> tuple[float, float]:
        """(the instant the scheduler gets, the stamp kept) for an arrival seen at `raw_s`."""
        raw_s = max(raw_s, self.last_raw_s)
        while (at_s := self._accumulate(raw_s)) <= self.admitted_s:
            raw_s = math.nextafter(max(raw_s, self.admitted_s), math.inf)
        self.last_arrival_s, self.last_raw_s = at_s, raw_s
        return at_s, raw_s

    def admitted_until(self, t_s: float) -> None:
        """The loop has added every arrival up to `t_s`."""
        self.admitted_s = max(self.admitted_s, t_s)

    def _accumulate(self, raw_s: float) -> float:
        """The instant drive() gives an arrival: the previous one plus the gap, as SimPy adds."""
        gap_s = raw_s - self.last_arrival_s
        return self.last_arrival_s + gap_s if gap_s > 0 else self.last_arrival_s
