"""Where a run is in steady state: MSER-5 truncation at both ends, and a trend test.

Why: a run starts empty (its first requests meet no queue) and, with a fixed
request count, ends emptying; a figure averaged over either end is a
transient, not what the deployment delivers. docs/statistics.md names the rules:

- MSER-5 (White 1997; White, Cobb and Spratt 2000) on two per-request series
  in arrival order, E2E latency and the number in the system each arrival
  finds (the later start and earlier end win): a series is cut into batches
  of 5; truncating the first d batches leaves the mean squared error
  statistic sum((z_j - mean)^2) / (m - d)^2 over the rest;
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


def weighted_mser_cut(means: np.ndarray, weights: np.ndarray) -> int:
    """How many leading batches MSER truncates from batch `means` of `weights` samples each.

    MSER's statistic with batches of unequal size: over the batches kept,
    sum(w_j (z_j - mean)^2) / (sum w_j)^2, the weighted mean being theirs; with
    equal weights it is mser_cut's on the batch means. Batches of weight 0 (no
    samples) count for nothing; only the first half of the batches may be cut.
    """
    w = np.asarray(weights, dtype=np.float64)
    m = w.size
    if m < 2 or not w.sum() > 0:
        return 0
    z = np.where(w > 0, np.nan_to_num(np.asarray(means, dtype=np.float64)), 0.0)
    z = z - np.average(z, weights=w)  # centred: the sums below do not cancel
    tail_w = np.cumsum(w[::-1])[::-1]
    tail_sum = np.cumsum((w * z)[::-1])[::-1]
    tail_sq = np.cumsum((w * z * z)[::-1])[::-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        stat = np.where(tail_w > 0, (tail_sq - tail_sum**2 / tail_w) / tail_w**2, np.inf)
    return int(np.argmin(stat[: m // 2 + 1]))


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


def in_system_at_arrival(arrival_s: np.ndarray, leave_s: np.ndarray) -> np.ndarray:
    """How many requests each arrival finds in the system (arrived before it, not yet left),
    in arrival order; `leave_s` is each request's finish (a rejected one leaves on arrival)."""
    times = np.sort(np.asarray(arrival_s, dtype=np.float64), kind="stable")
    leaves = np.sort(np.asarray(leave_s, dtype=np.float64))
    return np.arange(times.size) - np.searchsorted(leaves, times, side="left")


def _kept_span(times: np.ndarray, series: np.ndarray) -> tuple[float, float] | None:
    """MSER-5 from the start, then on what is left from the end: the kept arrivals' span."""
    head = mser_cut(series)
    tail = mser_cut(series[head:][::-1])
    kept = times[head: times.size - tail]
    return (float(kept[0]), float(kept[-1])) if kept.size >= 2 else None


def measurement_window(arrival_s: np.ndarray, latency_s: np.ndarray,
                       leave_s: np.ndarray | None = None) -> Window:
    """MSER-5 on the per-request `latency_s` (NaN = not finished) in arrival order, from the
    start and then, on what is left, from the end; with `leave_s` (finish times, a rejected
    request's arrival) also on the number in the system each arrival finds, cutting the
    later start and the earlier end of the two.

    Why both: a long-output workload's E2E latency is mostly its own decoding, so its
    series barely shows the server filling up from empty; the number in the system does,
    and counting completions from an empty start would understate the throughput by the
    fill. The window runs from the first kept arrival to the last; every request arriving
    in it (rejected ones too) counts. Fewer than two kept requests: the whole run.
    """
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    order = np.argsort(arrival_s, kind="stable")
    times = arrival_s[order]
    if times.size == 0:
        return Window(math.nan, math.nan, 0, 0, 0)
    lat = np.asarray(latency_s, dtype=np.float64)[order]
    done = ~np.isnan(lat)
    spans = [_kept_span(times[done], lat[done])]
    if leave_s is not None:
        spans.append(_kept_span(times, in_system_at_arrival(arrival_s, leave_s)))
    if any(span is None for span in spans) or max(s[0] for s in spans) >= min(
            s[1] for s in spans):
        return Window(float(times[0]), float(times[-1]), 0, 0, int(times.size))
    start_s, end_s = max(s[0] for s in spans), min(s[1] for s in spans)
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
