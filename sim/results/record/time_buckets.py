"""TimeBuckets: the run's step aggregates over simulated time, in bounded memory.

Apart from sim.results.stats.percentiles because it is the time series (timeseries.csv and the
summary's busy-time sums), not a distribution: at most `max_buckets` buckets whose
width doubles as the run grows, so memory is fixed however many steps run. The
recorder folds steps in bulk (`add_many`), with the same floats as `add` one step at
a time (sim.results.stats.inorder says how).
"""

from __future__ import annotations

import math

import numpy as np

from sim.results.stats.inorder import add_in_order, covered_rise

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
