"""Percentiles and bounded-memory step accumulators for the run recorder.

A long run has tens of millions of engine steps; storing one row per step
would make memory follow work done rather than requests in flight. The two
accumulators here are O(1) in the number of steps (a fixed log-bin histogram
for pooled ITL, at most `max_buckets` time buckets for the time series), in
fixed-size numpy arrays. The recorder folds steps into them in bulk
(`add_many`, from sim.results.step_buffer's blocks), which gives the same
bins and floats as `add` one step at a time (sim.results.inorder says how);
`add` stays as the plain definition the bulk form is tested against.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from math import log

import numpy as np

from sim.results.inorder import add_in_order, covered_rise, floor_log
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
        lo = self.lo_s
        if float(values_s.min()) >= lo:
            idx = floor_log(values_s, self._scale, self._offset)
        else:
            idx = np.zeros(size, dtype=np.int64)
            above = values_s >= lo
            idx[above] = floor_log(values_s[above], self._scale, self._offset)
        # add's int() truncates where floor_log floors: they differ only on (-1, 0); the
        # bins' weights are integer sums far below 2**53, exact in bincount's float64
        idx = np.clip(idx, 0, self._top)
        low = int(idx.min())
        added = np.bincount(idx - low, weights)
        self._counts[low:low + len(added)] += added.astype(np.int64)
        seen = self.count + np.cumsum(weights)
        shares = (weights / seen).tolist()  # weight / n, as add divides two ints
        mean = before = self._mean
        means = array("d")
        append = means.append
        for value_s, share in zip(values_s.tolist(), shares, strict=True):
            mean += (value_s - mean) * share
            append(mean)
        after = np.frombuffer(means, dtype=np.float64)
        delta = values_s - np.concatenate(((before,), after[:-1]))
        m2_terms = (weights * delta) * (values_s - after)
        self._m2 = float(add_in_order(np.array([[self._m2]]), m2_terms[:, None],
                                      np.zeros(1, dtype=np.int64))[0, 0])
        self._mean, self.count = mean, int(seen[-1])
        self.min_s = min(self.min_s, float(values_s.min()))
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
            setattr(self, name, np.zeros(max_buckets, dtype=_dtype(name)))

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

    def add_many(self, start_s: np.ndarray, duration_s: np.ndarray, batch_size: np.ndarray,
                 num_waiting: np.ndarray, num_running: np.ndarray, kv_blocks_used: np.ndarray,
                 tokens: np.ndarray, tokens_emitted: np.ndarray, kv_held: np.ndarray,
                 kv_live: np.ndarray) -> None:
        """add() for each step in order (one array a field), in bulk: the same floats.

        Steps go in pieces within which every start is covered and bucket indices do
        not fall (a fleet's recorder sees its replicas' steps interleaved), so each
        piece's buckets are consecutive groups; a bucket's sums add its steps'
        terms in order (`add_in_order`), and widening happens at the same step as
        add() one step at a time would.
        """
        total, pos = len(duration_s), 0
        while pos < total:
            idx = (start_s[pos:] * self._inv_width).astype(np.int64)
            stop = pos + covered_rise(idx, self.max_buckets)
            if stop == pos:  # this step starts past the covered range (or before 0)
                self._cover(float(start_s[pos]))
                continue
            part = slice(pos, stop)
            self._add_rising(idx[:stop - pos], duration_s[part], batch_size[part],
                             num_waiting[part], num_running[part], kv_blocks_used[part],
                             tokens[part], tokens_emitted[part], kv_held[part], kv_live[part])
            pos = stop

    def _add_rising(self, idx: np.ndarray, duration_s: np.ndarray, batch_size: np.ndarray,
                    num_waiting: np.ndarray, num_running: np.ndarray,
                    kv_blocks_used: np.ndarray, tokens: np.ndarray, tokens_emitted: np.ndarray,
                    kv_held: np.ndarray, kv_live: np.ndarray) -> None:
        """Steps in buckets `idx` (covered, non-decreasing): each bucket one group."""
        starts = np.flatnonzero(np.diff(idx, prepend=-1))
        buckets = idx[starts]  # distinct: each bucket's sums are written once
        reported = kv_held >= 0
        factors = np.empty((len(idx), len(_BUCKET_FLOAT_SUMS)))  # _BUCKET_FLOAT_SUMS' order
        factors[:, 0] = 1.0
        factors[:, 1], factors[:, 2], factors[:, 3] = batch_size, num_waiting, num_running
        factors[:, 4], factors[:, 5] = kv_blocks_used, reported
        factors[:, 6], factors[:, 7] = kv_held * reported, kv_live * reported
        # add()'s terms: factor x duration (an unreported step adds 0.0, leaving the sum)
        terms = factors * duration_s[:, None]
        init = np.stack([getattr(self, name)[buckets] for name in _BUCKET_FLOAT_SUMS], axis=1)
        new = add_in_order(init, terms, starts)
        for j, name in enumerate(_BUCKET_FLOAT_SUMS):
            getattr(self, name)[buckets] = new[:, j]
        self.steps[buckets] += np.diff(starts, append=len(idx))
        self.tokens[buckets] += np.add.reduceat(tokens, starts)
        self.tokens_emitted[buckets] += np.add.reduceat(tokens_emitted, starts)
        for name, x in zip(_BUCKET_MAXES, (batch_size, num_waiting, num_running,
                                           kv_blocks_used), strict=True):
            column = getattr(self, name)
            column[buckets] = np.maximum(column[buckets], np.maximum.reduceat(x, starts))

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
            merge = np.maximum if name in _BUCKET_MAXES else np.add  # pair by pair
            new = np.zeros_like(old)
            new[:half] = merge(old[0::2], old[1::2])
            setattr(self, name, new)
        self.width_s *= 2.0
        self._inv_width = 1.0 / self.width_s

    def frame(self) -> dict[str, np.ndarray]:
        """One row per non-empty bucket; means are weighted by busy time (NaN if none)."""
        rows = np.flatnonzero(self.steps)
        col = {name: getattr(self, name)[rows]
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


def _dtype(name: str) -> type:
    return np.float64 if name in _BUCKET_FLOAT_SUMS else np.int64
