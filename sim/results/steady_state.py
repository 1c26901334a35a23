"""Where a run is in steady state: MSER-5 truncation at both ends, and a trend test.

Why: a run starts empty (its first requests meet no queue) and, with a fixed
request count, ends emptying; a figure averaged over either end is a
transient, not what the deployment delivers. docs/statistics.md names the rules:

- MSER-5 (White 1997; White, Cobb and Spratt 2000): the series, in arrival
  order, is cut into batches of 5; truncating the first d batches leaves the
  mean squared error statistic sum((z_j - mean)^2) / (m - d)^2 over the rest;
  the d that minimises it (searched over the first half) is cut. The same
  rule on the reversed series cuts the final stretch, so the window ends at
  an arrival (never in the drain after the last one).
- Mann-Kendall: S = sum over i < j of sign(x_j - x_i), its variance under no
  trend n(n-1)(2n+5)/18 less the ties' share, one-sided p-value of the
  continuity-corrected z. Applied to batch means of the waiting time, so
  the serial correlation of a queue's waits is mostly averaged away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MSER_BATCH = 5


def mser_cut(series: np.ndarray, batch: int = MSER_BATCH) -> int:
    """How many leading observations MSER-`batch` truncates (a multiple of `batch`).

    Only the first half of the batches may be cut; a series of fewer than two
    batches is left whole.
    """
    x = np.asarray(series, dtype=np.float64)
    m = x.size // batch
    if m < 2:
        return 0
    z = x[: m * batch].reshape(m, batch).mean(axis=1)
    z = z - z.mean()  # centred: the sums below do not cancel
    tail_sum = np.cumsum(z[::-1])[::-1]  # sum of z[d:]
    tail_sq = np.cumsum((z * z)[::-1])[::-1]
    n = np.arange(m, 0, -1, dtype=np.float64)  # m - d
    stat = (tail_sq - tail_sum**2 / n) / n**2
    d_max = m // 2
    return int(np.argmin(stat[: d_max + 1])) * batch


@dataclass(frozen=True, slots=True)
class Window:
    """The measurement window: requests arriving in [start_s, end_s]; the rest cut."""

    start_s: float
    end_s: float
    excluded_start: int  # requests arriving before start_s
    excluded_end: int  # requests arriving after end_s
    kept: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def holds(self, times_s: np.ndarray) -> np.ndarray:
        """Which of `times_s` fall inside the window (both ends in)."""
        return (times_s >= self.start_s) & (times_s <= self.end_s)


def measurement_window(arrival_s: np.ndarray, latency_s: np.ndarray) -> Window:
    """MSER-5 on the per-request `latency_s` (NaN = not finished) in arrival order, from
    the start and then, on what is left, from the end.

    The window runs from the first kept finished request's arrival to the last's;
    every request arriving in it (rejected ones too) counts. Fewer than two kept
    requests: the whole run.
    """
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    order = np.argsort(arrival_s, kind="stable")
    lat = np.asarray(latency_s, dtype=np.float64)[order]
    finished = np.flatnonzero(~np.isnan(lat))
    series = lat[finished]
    head = mser_cut(series)
    tail = mser_cut(series[head:][::-1])
    kept = finished[head: finished.size - tail]
    times = arrival_s[order]
    if kept.size < 2 or times[kept[-1]] <= times[kept[0]]:
        if times.size == 0:
            return Window(math.nan, math.nan, 0, 0, 0)
        return Window(float(times[0]), float(times[-1]), 0, 0, int(times.size))
    start_s, end_s = float(times[kept[0]]), float(times[kept[-1]])
    before = int(np.searchsorted(times, start_s, side="left"))
    after = int(times.size - np.searchsorted(times, end_s, side="right"))
    return Window(start_s, end_s, before, after, int(times.size - before - after))


def batch_means(values: np.ndarray, num_batches: int) -> np.ndarray:
    """Means of `num_batches` contiguous, near-equal groups of `values` (NaNs skipped)."""
    v = np.asarray(values, dtype=np.float64)
    groups = np.array_split(v, num_batches) if v.size >= num_batches else [v]
    return np.array([np.nanmean(g) if np.any(~np.isnan(g)) else math.nan for g in groups])


@dataclass(frozen=True, slots=True)
class Trend:
    """A one-sided Mann-Kendall test for an upward trend."""

    s: int
    z: float
    p_value: float

    def upward(self, alpha: float) -> bool:
        return self.p_value < alpha


def mann_kendall(x: np.ndarray) -> Trend:
    """Mann-Kendall S, z and the one-sided p-value of an upward trend (NaNs dropped)."""
    v = np.asarray(x, dtype=np.float64)
    v = v[~np.isnan(v)]
    n = v.size
    if n < 3:
        return Trend(0, 0.0, 1.0)
    diff = v[None, :] - v[:, None]
    s = int(np.sign(diff[np.triu_indices(n, k=1)]).sum())
    _, ties = np.unique(v, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
    if var <= 0:
        return Trend(s, 0.0, 1.0)
    z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
    p = 0.5 * math.erfc(z / math.sqrt(2))  # P(Z >= z)
    return Trend(s, z, p)
