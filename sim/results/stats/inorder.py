"""Bulk numpy forms of the recorder's per-step arithmetic that give the same floats.

Why: the recorder folds hundreds of thousands of steps; a Python loop per step
costs a microsecond, a numpy pass over many steps a few nanoseconds each. But
the published figures are the floats the step-by-step loop produces, so each
bulk form here must equal its loop bit for bit:

- `add_in_order`: a running float sum added left to right. np.sum and
  np.add.reduce sum pairwise (different floats); np.add.accumulate adds in
  order, out[k] = out[k - 1] + x[k], so its last row is the loop's sum.
  Several sums that restart at group boundaries are done in one pass by
  laying the groups out as columns padded with -0.0, since x + (-0.0) == x for
  every float x (+0.0 included), and adding the block's rows (`sum_rows`).
- `floor_log`: floor(math.log(v) * scale - offset), a log-bin index. np.log
  may differ from the C library's log by an ulp, which moves the product by
  far less than `EDGE` (about 1e-11 here: |log v| < 710, scale ~ 1e3), so it
  can change the floor only where the product lies within EDGE of an integer:
  those few values are recomputed with math.log.
"""

from __future__ import annotations

import math

import numpy as np

EDGE = 1e-6  # products this close to an integer are binned with math.log


def floor_log(values: np.ndarray, scale: float, offset: float = 0.0) -> np.ndarray:
    """math.floor(math.log(v) * scale - offset) for each positive finite v, as int64."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.log(values) * scale - offset
        near = ~(np.abs(t - np.rint(t)) >= EDGE)  # NaN and inf too: math.log decides
    out = np.floor(t, where=~near, out=np.zeros(t.shape)).astype(np.int64)
    if near.any():
        for j in np.flatnonzero(near).tolist():
            out[j] = math.floor(math.log(float(values[j])) * scale - offset)
    return out


def add_in_order(init: np.ndarray, terms: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running sums restarted per group, each added left to right as a Python loop would.

    `terms` (steps x k) holds consecutive groups starting at the rows `starts`
    (ascending, the first 0); group g's sums start from `init[g]` (k values).
    Returns (groups x k): init[g] + terms[starts[g]] + ... + terms[last row of g].
    Groups of up to a few times the mean length share one padded accumulate; a
    longer one (rare: a bucket that took most steps) gets its own.
    """
    groups, steps = len(starts), len(terms)
    if groups == 1:
        block = np.empty((steps + 1, *terms.shape[1:]))
        block[0], block[1:] = init[0], terms
        return np.add.accumulate(block, axis=0)[-1:]
    lengths = np.diff(starts, append=steps)
    width = max(8, 4 * steps // groups)
    out = np.empty(init.shape)
    short = lengths <= width
    rows = short.nonzero()[0]
    if rows.size:
        longest, some = int(lengths[rows].max()), lengths[rows]
        # a group a column, its terms down the rows: the accumulate adds whole rows
        block = np.full((longest + 1, rows.size, *terms.shape[1:]), -0.0)
        block[0] = init[rows]
        group = np.arange(rows.size).repeat(some)
        offset = np.arange(group.size) - (some.cumsum() - some).repeat(some)
        # (row, group) as one index into the block's rows of k (one fancy index, not two)
        at = (offset + 1) * rows.size + group
        block.reshape(-1, *terms.shape[1:])[at] = (
            terms if rows.size == groups else terms[starts[rows].repeat(some) + offset])
        out[rows] = sum_rows(block)
    for g in np.flatnonzero(~short).tolist():
        a, n = int(starts[g]), int(lengths[g])
        out[g] = add_in_order(init[g:g + 1], terms[a:a + n], starts[:1])[0]
    return out


def sum_rows(block: np.ndarray) -> np.ndarray:
    """block[0] + block[1] + ... + block[-1], added a whole row at a time, in order.

    Why not always np.add.accumulate: along axis 0 it runs one strided inner loop a
    column, ten times slower than np.add.reduce on a wide block. np.add.reduce over
    axis 0 of a C-contiguous block of two or more values a row runs its inner loop
    along a row (out[j] += block[i, j], row after row: the sequential sums); with one
    value a row it is a 1-D reduction, which numpy sums pairwise, so that case
    accumulates. numpy does not promise this order: tests/test_recorder_bulk.py checks
    it against Python's left-to-right sums over many shapes.
    """
    if block[0].size >= 2 and block.flags.c_contiguous:
        return np.add.reduce(block, axis=0)
    return np.add.accumulate(block, axis=0)[-1]


def covered_rise(idx: np.ndarray, limit: int) -> int:
    """How many leading bucket indices lie in [0, limit) without ever falling: the steps
    a bulk add can take as consecutive groups before the buckets must widen."""
    bad = (idx < 0) | (idx >= limit)
    bad[1:] |= idx[1:] < idx[:-1]
    first = np.flatnonzero(bad)
    return int(first[0]) if first.size else len(idx)
