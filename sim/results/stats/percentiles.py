"""Percentiles and the pooled-ITL histogram: the run recorder's bounded-memory statistics.

A long run has tens of millions of engine steps; storing one row per step
would make memory follow work done rather than requests in flight. The
accumulators the recorder keeps are O(1) in the number of steps (a fixed log-bin
histogram for pooled ITL, here; at most `max_buckets` time buckets for the time
series, sim.results.record.time_buckets), in fixed-size numpy arrays. The recorder folds
steps into them in bulk (`add_many`, from sim.results.record.step_buffer's blocks), which
gives the same bins and floats as `add` one step at a time (sim.results.stats.inorder
says how); `add` stays as the plain definition the bulk form is tested against.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from math import log

import numpy as np

from sim.results.stats.inorder import add_in_order, floor_log
from sim.results.stats.sketch import linear_quantiles

PERCENTILES: tuple[int, ...] = (90, 95, 99)
STAT_NAMES: tuple[str, ...] = ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))


def weighted_percentiles(values: np.ndarray, weights: np.ndarray,
                         percentiles: Sequence[float]) -> np.ndarray:
    """Percentiles of `values` each repeated `weights` times (integer counts).

    Same result as `np.percentile(np.repeat(values, weights), q)` (method
    'linear', numpy's and vLLM's default) without expanding the samples.
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.int64)
    keep = w > 0
    v, w = v[keep], w[keep]
    q = np.asarray(percentiles, dtype=np.float64) / 100.0
    if v.size == 0:
        return np.full(q.shape, math.nan)
    order = np.argsort(v, kind="stable")
    v = v[order]
    cum = np.cumsum(w[order])
    pos = (cum[-1] - 1) * q
    lo = np.floor(pos)
    t = pos - lo
    a = v[np.searchsorted(cum, lo, side="right")]
    b = v[np.searchsorted(cum, np.minimum(lo + 1, cum[-1] - 1), side="right")]
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)  # numpy's _lerp


def describe_ms(values_s: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """Mean, median, population std (as np.std) and tail percentiles, in ms; NaNs ignored."""
    v = np.asarray(values_s, dtype=np.float64)
    w = np.ones(v.shape, dtype=np.int64) if weights is None else np.asarray(weights, np.int64)
    keep = ~np.isnan(v) & (w > 0)
    v, w = v[keep] * 1e3, w[keep]
    if v.size == 0:
        return dict.fromkeys(STAT_NAMES, math.nan)
    mean = float(np.average(v, weights=w))
    std = float(math.sqrt(np.average((v - mean) ** 2, weights=w)))
    pct = weighted_percentiles(v, w, (50, *PERCENTILES))
    return _stats_dict(mean, std, pct)


def _stats_dict(mean: float, std: float, pct: np.ndarray) -> dict[str, float]:
    out = {"mean": mean, "median": float(pct[0]), "std": std}
    out.update({f"p{p}": float(x) for p, x in zip(PERCENTILES, pct[1:], strict=True)})
    return out


class LogHistogram:
    """Weighted samples: exact count, mean, std, min and max; percentiles to a stated bound.

    Bins grow by r = 1 + rel_width from `lo_s` up past `hi_s`, plus an underflow
    and an overflow bin. A percentile is numpy's 'linear' interpolation between
    the two order statistics around its rank, each replaced by its bin's
    geometric midpoint clamped to the exact [min, max] (rank 0 and the last rank
    use min and max themselves). A sample in [lo_s, hi_s) is within a factor
    sqrt(r) of its midpoint and interpolation keeps that factor, so there
    |estimate / np.percentile - 1| <= sqrt(r) - 1: 5.0e-4 at the default 0.1%
    bins (23,000 of them, 1 us to 1e4 s). Outside that range a sample is
    represented by the exact min or max. Mean and std use Welford's weighted
    update: E[x^2] - mean^2 cancels when std << mean (steady-batch ITL), and
    would lose the 1e-9 relative accuracy the summary promises.
    """

    __slots__ = ("lo_s", "rel_width", "_counts", "_scale", "_offset", "_top",
                 "count", "_mean", "_m2", "min_s", "max_s")

    def __init__(self, lo_s: float = 1e-6, hi_s: float = 1e4, rel_width: float = 1e-3) -> None:
        if not (0 < lo_s < hi_s and rel_width > 0):
            raise ValueError("need 0 < lo_s < hi_s and rel_width > 0")
        self.lo_s, self.rel_width = lo_s, rel_width
        self._scale = 1.0 / math.log1p(rel_width)
        self._offset = log(lo_s) * self._scale - 1.0  # lo_s lands in bin 1
        num_bins = math.ceil(log(hi_s / lo_s) * self._scale)
        self._top = num_bins + 1  # overflow bin
        self._counts = np.zeros(num_bins + 2, dtype=np.int64)
        self.count = 0
        self._mean = 0.0
        self._m2 = 0.0
        self.min_s = math.inf
        self.max_s = -math.inf

    def add(self, value_s: float, weight: int) -> None:
        """Add `weight` (> 0) samples of `value_s`; ~0.4 us."""
        if value_s >= self.lo_s:
            i = int(log(value_s) * self._scale - self._offset)
            if i > self._top:
                i = self._top
        else:
            i = 0
        self._counts[i] += weight
        n = self.count + weight
        delta = value_s - self._mean
        self._mean += delta * (weight / n)  # exactly value_s for the first sample
        self._m2 += weight * delta * (value_s - self._mean)
        self.count = n
        if value_s < self.min_s:
            self.min_s = value_s
        if value_s > self.max_s:
            self.max_s = value_s

    def add_many(self, values_s: np.ndarray, weights: np.ndarray) -> None:
        """add(value, weight) for each pair in order, in bulk: the same bins and floats.

        Bins by `floor_log` (the same index as add's math.log); Welford's mean is
        a running recurrence, so it stays a loop, two float operations a sample;
        M2's terms then follow from the means and are added in order.
        """
        size = len(values_s)
        if not size:
            return
        lo, smallest = self.lo_s, float(values_s.min())
        if smallest >= lo:
            idx = floor_log(values_s, self._scale, self._offset)
        else:
            idx = np.zeros(size, dtype=np.int64)
            above = values_s >= lo
            idx[above] = floor_log(values_s[above], self._scale, self._offset)
        # add's int() truncates where floor_log floors: they differ only on (-1, 0); the
        # bins' weights are integer sums far below 2**53, exact in bincount's float64
        idx = idx.clip(0, self._top)
        low = int(idx.min())
        added = np.bincount(idx - low, weights)
        self._counts[low:low + len(added)] += added.astype(np.int64)
        seen = self.count + np.cumsum(weights)
        # weight / n, as add divides two ints (both exact in float64, far below 2**53);
        # the loop reads both arrays through memoryviews, which yield the same Python
        # floats as tolist() without building the lists (a fifth fewer instructions;
        # float64 and contiguous, which a memoryview can always step through)
        shares = memoryview(weights / seen)
        values = memoryview(np.ascontiguousarray(values_s, dtype=np.float64))
        mean = self._mean
        means = [mean]  # the mean before each sample, then after the last
        means += [mean := mean + (value_s - mean) * share
                  for value_s, share in zip(values, shares, strict=True)]
        both = np.frombuffer(struct.pack(f"{size + 1}d", *means))  # 4x cheaper than np.array
        after = both[1:]
        m2_terms = (weights * (values_s - both[:-1])) * (values_s - after)
        self._m2 = float(add_in_order(np.array([[self._m2]]), m2_terms[:, None],
                                      np.zeros(1, dtype=np.int64))[0, 0])
        self._mean, self.count = mean, int(seen[-1])
        self.min_s = min(self.min_s, smallest)
        self.max_s = max(self.max_s, float(values_s.max()))

    @property
    def num_bins(self) -> int:
        return len(self._counts)

    @property
    def mean_s(self) -> float:
        return self._mean if self.count else math.nan

    @property
    def std_s(self) -> float:
        """Population std, as np.std."""
        return math.sqrt(max(self._m2, 0.0) / self.count) if self.count else math.nan

    def percentiles(self, percentiles: Sequence[float]) -> np.ndarray:
        """Approximate np.percentile (method 'linear') of the samples; see the class bound."""
        q = np.asarray(percentiles, dtype=np.float64) / 100.0
        n = self.count
        if n == 0:
            return np.full(q.shape, math.nan)
        cum = np.cumsum(self._counts)
        idx = np.arange(self._top + 1, dtype=np.float64)
        mids = np.exp((idx + 0.5 + self._offset) / self._scale)
        mids[0], mids[-1] = -math.inf, math.inf  # under- and overflow: clipped to min, max
        return linear_quantiles(mids, cum, q, self.min_s, self.max_s)

    def describe_ms(self) -> dict[str, float]:
        """The same keys as `describe_ms`, in ms."""
        if self.count == 0:
            return dict.fromkeys(STAT_NAMES, math.nan)
        pct = self.percentiles((50, *PERCENTILES)) * 1e3
        return _stats_dict(self.mean_s * 1e3, self.std_s * 1e3, pct)
