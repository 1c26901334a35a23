"""A mergeable quantile sketch of relative error `a`: bounded memory for any number of samples.

Why: a run of millions of requests must not keep one latency per request to
report its percentiles, and the measurement window (sim.results.files.steady) is
chosen after the run, so the sketches of the time batches it keeps must merge
into the window's. DDSketch's idea (Masson, Rim and Lee, VLDB 2019), written
here from the definition: a positive sample x falls in bucket
i = ceil(log(x) / log(gamma)), gamma = (1 + a) / (1 - a), which covers
(gamma^(i-1), gamma^i]; the bucket stands for 2 gamma^i / (gamma + 1), which is
within a factor [1 - a, 1 + a] of every value in the bucket.

The bound: a quantile is numpy's default ('linear'): with n samples, rank
pos = q (n - 1), interpolated between the order statistics at floor(pos) and
floor(pos) + 1. Each order statistic is replaced by its bucket's value, clamped
to the exact [min, max] (the first and last order statistics are min and max
themselves), so each is within a relative `a` of the exact one, and a linear
interpolation of non-negative values keeps that:
|sketch quantile - np.quantile| <= a * np.quantile (plus the last bits of float
rounding in log). Zero is counted apart and is exact. Memory: the buckets
from the lowest to the highest one used, 8 bytes each in one typed array, at
most ceil(log(hi / lo) / log(gamma)) + 1 for samples in [lo, hi] (a=0.5%:
2,303 for 1 us to 1e4 s, about 115 per decade), whatever the count. (A dict
of only the non-empty buckets costs ~90 bytes a bucket in Python; a run keeps
a few thousand sketches, one per metric and time batch.) Merging adds counts,
so merge(a, b) has the same buckets, count, min, max and quantiles as one
sketch of both sample sets.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from sim.results.stats.inorder import floor_log

DEFAULT_RELATIVE_ERROR = 0.005


class QuantileSketch:
    """Non-negative samples: exact count, zeros, min and max; quantiles within relative `a`."""

    __slots__ = ("relative_error", "_inv_log_gamma", "_counts", "_offset", "zeros", "count",
                 "min", "max")

    def __init__(self, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        if not 0.0 < relative_error < 1.0:
            raise ValueError(f"relative_error must be in (0, 1), got {relative_error}")
        self.relative_error = relative_error
        self._inv_log_gamma = _inv_log_gamma(relative_error)
        self._counts = array("q")  # bucket _offset + j at index j
        self._offset = 0
        self.zeros = 0
        self.count = 0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        """Count one sample (>= 0; a negative or NaN one is refused)."""
        if value > 0.0:
            i = math.ceil(math.log(value) * self._inv_log_gamma)
            j = i - self._offset
            if not 0 <= j < len(self._counts):
                self._cover(i, i)
                j = i - self._offset
            self._counts[j] += 1
        elif value == 0.0:
            self.zeros += 1
        else:
            raise ValueError(f"a sketch takes values >= 0, got {value}")
        self.count += 1
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def _cover(self, lo: int, hi: int) -> None:
        """Widen the array to hold buckets lo..hi (and what it held): one new array, and
        none where it holds them already (most merges)."""
        counts, offset = self._counts, self._offset
        if counts:
            if offset <= lo and hi < offset + len(counts):
                return
            lo, hi = min(lo, offset), max(hi, offset + len(counts) - 1)
        grown = array("q", bytes(8 * (hi - lo + 1)))
        grown[offset - lo:offset - lo + len(counts)] = counts
        self._counts, self._offset = grown, lo

    def add_all(self, values: Iterable[float]) -> None:
        for value in values:
            self.add(value)

    def add_many(self, values: np.ndarray) -> None:
        """add(v) for each v, in bulk: the same buckets, counts, min and max."""
        positive = values > 0.0
        if not (positive | (values == 0.0)).all():
            bad = values[~(positive | (values == 0.0))][0]
            raise ValueError(f"a sketch takes values >= 0, got {bad}")
        self.add_keyed(values.tolist(),
                       bucket_keys(values[positive], self.relative_error).tolist())

    def add_keyed(self, values: list[float], keys: list[int]) -> None:
        """add(v) for each v of `values` (all >= 0), given the buckets of the positive ones
        in order (`bucket_keys`): the caller bins many sketches' samples in one call."""
        if keys:
            lo, hi = min(keys), max(keys)
            self._cover(lo, hi)
            counts, offset = self._counts, self._offset
            for key in keys:
                counts[key - offset] += 1
        self.zeros += len(values) - len(keys)
        self.count += len(values)
        if values:  # min and max keep the first extreme, as add() does
            low, high = min(values), max(values)
            if low < self.min:
                self.min = low
            if high > self.max:
                self.max = high

    def update(self, other: QuantileSketch) -> None:
        """Add `other`'s samples to this sketch (same relative error)."""
        if other.relative_error != self.relative_error:
            raise ValueError("cannot merge sketches of different relative error")
        if not self._counts:  # the first of a merge: a copy
            self._counts, self._offset = array("q", other._counts), other._offset
        elif other._counts:
            lo, size = other._offset, len(other._counts)
            self._cover(lo, lo + size - 1)
            start = lo - self._offset
            mine = np.frombuffer(self._counts, dtype=np.int64)  # a view: adds in place
            mine[start:start + size] += np.frombuffer(other._counts, dtype=np.int64)
            del mine  # the array may grow again only once no view holds its buffer
        self.zeros += other.zeros
        self.count += other.count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @classmethod
    def merged(cls, sketches: Iterable[QuantileSketch],
               relative_error: float = DEFAULT_RELATIVE_ERROR) -> QuantileSketch:
        """One sketch of every sample of `sketches` (an empty one if there are none): the
        counts of all of them added into one numpy array, not one merge (and array) each."""
        parts = list(sketches)
        if any(s.relative_error != relative_error for s in parts):
            raise ValueError("cannot merge sketches of different relative error")
        out = cls(relative_error)
        held = [s for s in parts if s._counts]
        if held:
            lo = min(s._offset for s in held)
            total = np.zeros(max(s._offset + len(s._counts) for s in held) - lo, np.int64)
            for s in held:
                start = s._offset - lo
                total[start:start + len(s._counts)] += np.frombuffer(s._counts, np.int64)
            out._counts, out._offset = array("q", total.tobytes()), lo
        out.zeros = sum(s.zeros for s in parts)
        out.count = sum(s.count for s in parts)
        out.min = min((s.min for s in parts), default=math.inf)
        out.max = max((s.max for s in parts), default=-math.inf)
        return out

    @property
    def num_buckets(self) -> int:
        """Non-empty buckets: the sketch's size, bounded by the samples' range, not count."""
        return len(self._counts) - self._counts.count(0)

    def bucket_counts(self) -> dict[int, int]:
        """The non-empty buckets' counts by bucket index (tests compare merges by it)."""
        return {self._offset + j: n for j, n in enumerate(self._counts) if n}

    def quantiles(self, qs: Sequence[float]) -> np.ndarray:
        """np.quantile(samples, qs) (method 'linear') within the module's bound; NaN if empty."""
        q = np.asarray(qs, dtype=np.float64)
        n = self.count
        if n == 0:
            return np.full(q.shape, math.nan)
        counts = np.frombuffer(self._counts, dtype=np.int64) if self._counts else np.zeros(
            0, np.int64)
        keys = self._offset + np.arange(counts.size, dtype=np.float64)
        gamma = math.exp(1.0 / self._inv_log_gamma)
        values = np.concatenate([[0.0], 2.0 * np.exp(keys / self._inv_log_gamma) / (gamma + 1)])
        cum = np.cumsum(np.concatenate([[self.zeros], counts]))
        return linear_quantiles(values, cum, q, self.min, self.max)


def _inv_log_gamma(relative_error: float) -> float:
    return 1.0 / math.log((1 + relative_error) / (1 - relative_error))


def bucket_keys(values: np.ndarray, relative_error: float = DEFAULT_RELATIVE_ERROR
                ) -> np.ndarray:
    """QuantileSketch.add's bucket of each positive value, ceil(log(v) / log(gamma)) with
    math.log's floats, in bulk: ceil(x) = -floor(-x), and `floor_log` bins as math.log."""
    return -floor_log(values, -_inv_log_gamma(relative_error))


def add_grouped(sketch_of: Callable[[int], QuantileSketch], group: np.ndarray,
                values: np.ndarray) -> None:
    """sketch_of(g).add(v) for each sample v of group g (values >= 0), in bulk: the groups'
    bucket keys in one numpy call, then one add_keyed a group (a sketch's counts, min and
    max do not depend on the order its samples come in)."""
    order = np.argsort(group, kind="stable")
    group, values = group[order], values[order]
    positive = values > 0.0
    keys = bucket_keys(values[positive]).tolist()
    before = np.concatenate(([0], np.cumsum(positive))).tolist()  # keys before each row
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    ends = [*starts[1:].tolist(), len(group)]
    listed = values.tolist()
    for g, lo, hi in zip(group[starts].tolist(), starts.tolist(), ends, strict=True):
        sketch_of(g).add_keyed(listed[lo:hi], keys[before[lo]:before[hi]])


def linear_quantiles(values: np.ndarray, cum: np.ndarray, q: np.ndarray, lowest: float,
                     highest: float) -> np.ndarray:
    """np.quantile's 'linear' rule over bucketed samples: bucket j stands for `values[j]`,
    `cum` is the running count; the first and last order statistics are the exact
    `lowest` and `highest`, and every bucket value is clipped to them."""
    n = int(cum[-1])
    values = np.clip(values, lowest, highest)

    def order_stat(rank: np.ndarray) -> np.ndarray:
        x = values[np.searchsorted(cum, rank, side="right")]
        return np.where(rank == 0, lowest, np.where(rank == n - 1, highest, x))

    pos = (n - 1) * q
    lo = np.floor(pos).astype(np.int64)
    a, b = order_stat(lo), order_stat(np.minimum(lo + 1, n - 1))
    return a + (b - a) * (pos - lo)
