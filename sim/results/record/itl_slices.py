"""Inter-token gaps by time slice: what the measurement window needs of ITL.

ITL is a property of steps, not of requests, so the per-request columns cannot
give its percentiles over a window. The recorder adds each decode step here
too: at most `max_slices` slices of simulated time (the width doubles by
merging pairs, as `TimeBuckets` does), each a sparse log-bin histogram (bins
of relative width 1e-3, so a percentile is within 5e-4 of the exact one, as
`LogHistogram`) with its exact count and sum. Memory stays bounded: a slice
holds one entry per distinct bin its gaps fell in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from sim.results.stats.inorder import add_in_order, covered_rise, floor_log

_REL_WIDTH = 1e-3
_SCALE = 1.0 / math.log1p(_REL_WIDTH)


class ITLSlices:
    """Decode gaps (seconds, weighted by decodes) in slices of the step's start time."""

    __slots__ = ("max_slices", "width_s", "_bins", "_count", "_sum")

    def __init__(self, max_slices: int = 128, width_s: float = 0.25) -> None:
        if max_slices < 2 or max_slices % 2 or not width_s > 0:
            raise ValueError("max_slices must be even and >= 2, width_s > 0")
        self.max_slices, self.width_s = max_slices, width_s
        self._bins: list[Counter[int]] = [Counter() for _ in range(max_slices)]
        self._count = [0] * max_slices
        self._sum = [0.0] * max_slices

    def add(self, start_s: float, gap_s: float, weight: int) -> None:
        """`weight` gaps of `gap_s` from a step starting at `start_s` (>= 0)."""
        i = int(start_s / self.width_s)
        while i >= self.max_slices:
            self._merge_pairs()
            i = int(start_s / self.width_s)
        key = int(math.floor(math.log(gap_s) * _SCALE)) if gap_s > 0 else -(2**62)
        self._bins[i][key] += weight
        self._count[i] += weight
        self._sum[i] += gap_s * weight

    def add_many(self, start_s: np.ndarray, gap_s: np.ndarray, weights: np.ndarray) -> None:
        """add(start, gap, weight) for each step in order, in bulk: the same slices, bins
        and floats (a slice's sum adds its terms in order; pairs merge at the same step)."""
        total, pos = len(gap_s), 0
        while pos < total:
            idx = (start_s[pos:] / self.width_s).astype(np.int64)
            stop = pos + covered_rise(idx, self.max_slices)
            if stop == pos:  # past the covered range: as add(), merge until it is covered
                if idx[0] < 0:
                    raise ValueError(f"a step start must be >= 0, got {start_s[pos]}")
                self._merge_pairs()
                continue
            self._add_rising(idx[:stop - pos], gap_s[pos:stop], weights[pos:stop])
            pos = stop

    def _add_rising(self, idx: np.ndarray, gap_s: np.ndarray, weights: np.ndarray) -> None:
        """Steps in slices `idx` (covered, non-decreasing): each slice one group."""
        if float(gap_s.min()) > 0:
            keys = floor_log(gap_s, _SCALE)
        else:
            keys = np.full(len(gap_s), -(2**62), dtype=np.int64)
            timed = gap_s > 0
            keys[timed] = floor_log(gap_s[timed], _SCALE)
        new_slice = np.diff(idx, prepend=-1) != 0
        starts = np.flatnonzero(new_slice)
        slices = idx[starts].tolist()
        init = np.array([[self._sum[i]] for i in slices])
        sums = add_in_order(init, (gap_s * weights)[:, None], starts)[:, 0].tolist()
        # each run of steps in one (slice, bin) pair adds its weight at once (neighbouring
        # steps' gaps mostly share a bin: about one run in ten steps)
        first = np.flatnonzero(new_slice | (np.diff(keys, prepend=keys[0] - 1) != 0))
        totals = np.add.reduceat(weights, first)
        bins = self._bins
        for i, key, count in zip(idx[first].tolist(), keys[first].tolist(), totals.tolist(),
                                 strict=True):
            bins[i][key] += count
        counts = np.add.reduceat(weights, starts).tolist()
        for i, total_s, count in zip(slices, sums, counts, strict=True):
            self._count[i] += count
            self._sum[i] = total_s

    def _merge_pairs(self) -> None:
        half = self.max_slices // 2
        self._bins = [self._bins[2 * j] + self._bins[2 * j + 1] for j in range(half)] + [
            Counter() for _ in range(half)]
        self._count = [self._count[2 * j] + self._count[2 * j + 1] for j in range(half)] + [
            0] * half
        self._sum = [self._sum[2 * j] + self._sum[2 * j + 1] for j in range(half)] + [0.0] * half
        self.width_s *= 2.0

    def inside(self, start_s: float, end_s: float) -> list[int]:
        """The slices whose midpoint falls in [start_s, end_s]."""
        mids = (np.arange(self.max_slices) + 0.5) * self.width_s
        return [int(i) for i in np.flatnonzero((mids >= start_s) & (mids <= end_s))]

    def stats(self, slices: Sequence[int], percentiles: Sequence[float]) -> np.ndarray:
        """[mean, *percentiles] in seconds over `slices` merged; NaN without gaps."""
        merged: Counter[int] = Counter()
        count, total = 0, 0.0
        for i in slices:
            merged.update(self._bins[i])
            count += self._count[i]
            total += self._sum[i]
        if count == 0:
            return np.full(1 + len(percentiles), math.nan)
        keys = np.array(sorted(merged), dtype=np.float64)
        weights = np.array([merged[int(k)] for k in keys], dtype=np.float64)
        mids = np.exp((keys + 0.5) / _SCALE)
        cum = np.cumsum(weights)
        ranks = (count - 1) * np.asarray(percentiles, dtype=np.float64) / 100.0
        # nearest rank's bin midpoint: within the bin's relative width of the exact value
        pct = mids[np.minimum(np.searchsorted(cum, np.round(ranks), side="right"),
                              mids.size - 1)]
        return np.concatenate([[total / count], pct])

