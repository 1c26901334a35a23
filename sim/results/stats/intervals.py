"""95% confidence intervals: Student's t over independent estimates (replications), or
over batches of one run (batch means, with sectioning for percentiles).

Why two: independent replications need no assumption about a run's serial
correlation, but cost N runs; batch means get an interval from one run by
treating contiguous batches as near-independent, which holds when a batch is
much longer than the queue's correlation time (docs/statistics.md). For a
mean, the batch means average to the window's mean; for a percentile the
centre is the window's own percentile and the batches' spread gives the
half-width (sectioning: Asmussen and Glynn, Stochastic Simulation, IV.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.results.stats.student_t import t_ppf

LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Interval:
    """An estimate with its 95% interval; `n` is how many batches or replications gave it."""

    estimate: float
    half_width: float
    n: int

    @property
    def lo(self) -> float:
        return self.estimate - self.half_width

    @property
    def hi(self) -> float:
        return self.estimate + self.half_width

    def as_dict(self) -> dict[str, float | int]:
        return {"estimate": self.estimate, "lo": self.lo, "hi": self.hi,
                "half_width": self.half_width, "n": self.n}

    def clipped(self, low: float, high: float) -> Interval:
        """The same interval, its ends cut to [low, high] (a share cannot leave [0, 1])."""
        return Clipped(self.estimate, self.half_width, self.n, low, high)


@dataclass(frozen=True, slots=True)
class Clipped(Interval):
    """An interval cut to the values the quantity can take (a share: [0, 1])."""

    low: float = -math.inf
    high: float = math.inf

    @property
    def lo(self) -> float:
        return max(self.estimate - self.half_width, self.low)

    @property
    def hi(self) -> float:
        return min(self.estimate + self.half_width, self.high)


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided Student t quantile for `n` samples (n - 1 degrees of freedom)."""
    return t_ppf(0.5 + level / 2, n - 1)


def spread_interval(samples: np.ndarray, centre: float | None = None,
                    level: float = LEVEL) -> Interval:
    """t-interval from the spread of `samples` (NaNs dropped) around `centre`
    (default their mean); fewer than two samples: NaN half-width."""
    x = np.asarray(samples, dtype=np.float64)
    x = x[~np.isnan(x)]
    mid = float(x.mean()) if centre is None and x.size else (
        math.nan if centre is None else float(centre))
    if x.size < 2 or math.isnan(mid):
        return Interval(mid, math.nan, int(x.size))
    half = t_quantile(x.size, level) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mid, half, int(x.size))


def pooled(intervals: list[Interval], level: float = LEVEL) -> Interval:
    """Independent replications' estimates -> the t-interval of their mean."""
    return spread_interval(np.array([i.estimate for i in intervals]), level=level)
