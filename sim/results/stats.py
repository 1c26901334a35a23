"""Percentiles and bounded-memory step accumulators for the run recorder.

A long run has tens of millions of engine steps; storing one row per step
would make memory follow work done rather than requests in flight. The two
accumulators here are O(1) in the number of steps (a fixed log-bin histogram
for pooled ITL, at most `max_buckets` time buckets for the time series) and
cost about a microsecond per step. Their hot-path counters are plain Python
lists, not numpy arrays: item updates on a list are ~4x cheaper than numpy
scalar indexing, and the lists are fixed-size so memory stays bounded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from math import log

import numpy as np

from sim.results.sketch import linear_quantiles

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
        self._counts: list[int] = [0] * (num_bins + 2)
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

    def add_each(self, values_s: list[float], weight: int) -> None:
        """add(value, weight) for each value in order: the same floats, one loop."""
        counts, scale, offset, top, lo = self._counts, self._scale, self._offset, self._top, \
            self.lo_s
        n, mean, m2 = self.count, self._mean, self._m2
        for value_s in values_s:
            if value_s >= lo:
                i = int(log(value_s) * scale - offset)
                if i > top:
                    i = top
            else:
                i = 0
            counts[i] += weight
            n += weight
            delta = value_s - mean
            mean += delta * (weight / n)
            m2 += weight * delta * (value_s - mean)
        self.count, self._mean, self._m2 = n, mean, m2
        if values_s:
            self.min_s = min(self.min_s, *values_s)
            self.max_s = max(self.max_s, *values_s)

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
        cum = np.cumsum(np.array(self._counts, dtype=np.int64))
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


_BUCKET_FLOAT_SUMS = ("busy_s", "batch_x_s", "waiting_x_s", "running_x_s", "kv_x_s",
                      "kv_busy_s", "held_x_s", "live_x_s")
_BUCKET_INT_SUMS = ("steps", "tokens", "tokens_emitted")
_BUCKET_SUMS = (*_BUCKET_FLOAT_SUMS, *_BUCKET_INT_SUMS)
_BUCKET_MAXES = ("max_batch_size", "max_waiting", "max_running", "max_kv_blocks_used")


class TimeBuckets:
    """Step aggregates over simulated time in at most `max_buckets` equal-width buckets.

    Buckets cover [0, max_buckets * width_s). A step belongs to the bucket of
    its start time (so a bucket's busy time can exceed its width by the tail of
    its last step). When a step starts past the covered range the width doubles
    by merging adjacent pairs (sums add, maxima take the max), as often as
    needed: memory is fixed however long the run, and the time resolution is
    the run's span / max_buckets or finer. Queue length, running count and KV
    use are the values after each step, weighted by the step's duration; KV
    slots held and live tokens are those during the step, averaged over the
    busy time of the steps that reported them (`kv_held` < 0: not reported).
    """

    __slots__ = ("max_buckets", "width_s", "_inv_width", *_BUCKET_SUMS, *_BUCKET_MAXES)

    def __init__(self, max_buckets: int = 2048, width_s: float = 0.01) -> None:
        if max_buckets < 2 or max_buckets % 2 or not width_s > 0:
            raise ValueError("max_buckets must be even and >= 2, width_s > 0")
        self.max_buckets = max_buckets
        self.width_s = width_s
        self._inv_width = 1.0 / width_s
        for name in (*_BUCKET_SUMS, *_BUCKET_MAXES):
            setattr(self, name, [_zero(name)] * max_buckets)

    def add(self, start_s: float, duration_s: float, batch_size: int, num_waiting: int,
            num_running: int, kv_blocks_used: int, tokens: int, tokens_emitted: int,
            kv_held: int = -1, kv_live: int = 0) -> None:
        """Accumulate one step into the bucket holding `start_s` (>= 0)."""
        i = int(start_s * self._inv_width)
        if not 0 <= i < self.max_buckets:
            i = self._cover(start_s)
        self.busy_s[i] += duration_s
        self.batch_x_s[i] += batch_size * duration_s
        self.waiting_x_s[i] += num_waiting * duration_s
        self.running_x_s[i] += num_running * duration_s
        self.kv_x_s[i] += kv_blocks_used * duration_s
        self.steps[i] += 1
        self.tokens[i] += tokens
        self.tokens_emitted[i] += tokens_emitted
        if batch_size > self.max_batch_size[i]:
            self.max_batch_size[i] = batch_size
        if num_waiting > self.max_waiting[i]:
            self.max_waiting[i] = num_waiting
        if num_running > self.max_running[i]:
            self.max_running[i] = num_running
        if kv_blocks_used > self.max_kv_blocks_used[i]:
            self.max_kv_blocks_used[i] = kv_blocks_used
        if kv_held >= 0:
            self.kv_busy_s[i] += duration_s
            self.held_x_s[i] += kv_held * duration_s
            self.live_x_s[i] += kv_live * duration_s

    def add_steps(self, start_s: np.ndarray, duration_s: np.ndarray, batch_size: int,
                  num_waiting: np.ndarray, num_running: int, kv_blocks_used: np.ndarray,
                  tokens: int, tokens_emitted: int, kv_held: np.ndarray,
                  kv_live: np.ndarray) -> None:
        """add() for each step in order (starts non-decreasing, every kv_held >= 0).

        Each bucket's sums add the steps' terms in order, so every float equals
        add()'s one step at a time.
        """
        start = 0
        total = len(duration_s)
        while start < total:
            idx = (start_s[start:] * self._inv_width).astype(np.int64)
            over = np.flatnonzero(idx >= self.max_buckets)
            stop = total if not over.size else start + int(over[0])
            if stop == start:  # this step starts past the covered range: widen first
                self._cover(float(start_s[start]))
                continue
            self._add_within(idx[:stop - start], slice(start, stop), duration_s, batch_size,
                             num_waiting, num_running, kv_blocks_used, tokens,
                             tokens_emitted, kv_held, kv_live)
            start = stop

    def _add_within(self, idx: np.ndarray, part: slice, duration_s: np.ndarray,
                    batch_size: int, num_waiting: np.ndarray, num_running: int,
                    kv_blocks_used: np.ndarray, tokens: int, tokens_emitted: int,
                    kv_held: np.ndarray, kv_live: np.ndarray) -> None:
        """The steps of `part`, all within the covered range (bucket `idx` each), in order."""
        buckets = idx.tolist()
        durations = duration_s[part].tolist()
        waiting, used = num_waiting[part].tolist(), kv_blocks_used[part].tolist()
        held, live = kv_held[part].tolist(), kv_live[part].tolist()
        cuts = [0, *(np.flatnonzero(np.diff(idx)) + 1).tolist(), len(buckets)]
        for lo, hi in zip(cuts, cuts[1:]):  # noqa: B905 - one bucket's steps
            i = buckets[lo]
            busy, batch_x, waiting_x = self.busy_s[i], self.batch_x_s[i], self.waiting_x_s[i]
            running_x, kv_x, kv_busy = self.running_x_s[i], self.kv_x_s[i], self.kv_busy_s[i]
            held_x, live_x = self.held_x_s[i], self.live_x_s[i]
            for j in range(lo, hi):  # add()'s floats, in its order
                d = durations[j]
                busy += d
                batch_x += batch_size * d
                waiting_x += waiting[j] * d
                running_x += num_running * d
                kv_x += used[j] * d
                kv_busy += d
                held_x += held[j] * d
                live_x += live[j] * d
            self.busy_s[i], self.batch_x_s[i], self.waiting_x_s[i] = busy, batch_x, waiting_x
            self.running_x_s[i], self.kv_x_s[i], self.kv_busy_s[i] = running_x, kv_x, kv_busy
            self.held_x_s[i], self.live_x_s[i] = held_x, live_x
            count = hi - lo
            self.steps[i] += count
            self.tokens[i] += tokens * count
            self.tokens_emitted[i] += tokens_emitted * count
            if batch_size > self.max_batch_size[i]:
                self.max_batch_size[i] = batch_size
            top = max(waiting[lo:hi])
            if top > self.max_waiting[i]:
                self.max_waiting[i] = top
            if num_running > self.max_running[i]:
                self.max_running[i] = num_running
            top = max(used[lo:hi])
            if top > self.max_kv_blocks_used[i]:
                self.max_kv_blocks_used[i] = top

    def _cover(self, start_s: float) -> int:
        """Double the width until `start_s` is covered; return its bucket."""
        if not (start_s >= 0 and math.isfinite(start_s)):
            raise ValueError(f"step start must be finite and >= 0, got {start_s}")
        while (i := int(start_s * self._inv_width)) >= self.max_buckets:
            self._merge_pairs()
        return i

    def _merge_pairs(self) -> None:
        half = self.max_buckets // 2
        for name in (*_BUCKET_SUMS, *_BUCKET_MAXES):
            old = getattr(self, name)
            merge = max if name in _BUCKET_MAXES else _add
            new = [merge(old[2 * j], old[2 * j + 1]) for j in range(half)]
            setattr(self, name, new + [_zero(name)] * half)
        self.width_s *= 2.0
        self._inv_width = 1.0 / self.width_s

    def frame(self) -> dict[str, np.ndarray]:
        """One row per non-empty bucket; means are weighted by busy time (NaN if none)."""
        steps = np.array(self.steps, dtype=np.int64)
        rows = np.flatnonzero(steps)
        col = {name: np.array(getattr(self, name))[rows]
               for name in (*_BUCKET_SUMS, *_BUCKET_MAXES)}
        busy = col["busy_s"]
        kv_busy = col["kv_busy_s"]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = {name: np.where(busy > 0, col[f"{name}_x_s"] / busy, math.nan)
                     for name in ("batch", "waiting", "running", "kv")}
            means.update({name: np.where(kv_busy > 0, col[f"{name}_x_s"] / kv_busy, math.nan)
                          for name in ("held", "live")})
        return {"t_start_s": rows * self.width_s, "t_end_s": (rows + 1) * self.width_s,
                "steps": col["steps"], "busy_s": busy,
                "mean_batch_size": means["batch"], "max_batch_size": col["max_batch_size"],
                "mean_waiting": means["waiting"], "max_waiting": col["max_waiting"],
                "mean_running": means["running"], "max_running": col["max_running"],
                "mean_kv_blocks_used": means["kv"],
                "max_kv_blocks_used": col["max_kv_blocks_used"],
                "tokens": col["tokens"], "tokens_emitted": col["tokens_emitted"],
                "mean_kv_slots_held": means["held"], "mean_kv_live_tokens": means["live"]}


def _add(a: float, b: float) -> float:
    return a + b


def _zero(name: str) -> float:
    return 0.0 if name in _BUCKET_FLOAT_SUMS else 0
