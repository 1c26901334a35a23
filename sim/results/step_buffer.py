"""Steps waiting to be folded into the recorder's accumulators, a block of rows.

Why: folding a step costs a microsecond or more in Python, numpy over many
steps a few nanoseconds each, and a decode run is often a handful of steps. So
the recorder writes each step (a row) or decode run (rows) here and folds the
block in bulk when it is full or read. Every accumulator takes the steps in
the order they were recorded, so the floats are those of folding them one by
one. Memory is bounded by the block: at most `capacity` rows (8,192 by
default), held until the fold as the recorded tuples and the decode runs'
arrays, then laid out as rows of 2 floats and 12 ints.

A decode run costs one tuple until the fold, which lays out every run of the
block in a few numpy operations: its per-run values are one broadcast row, and
the KV slots held and live tokens, which grow by rule along the run, are stored
as that rule (held = blocks x block size + a constant, live = a + b x row) and
expanded then.
"""

from __future__ import annotations

from array import array

import numpy as np

# int columns: the first `_CONSTANTS` are constant along a decode run (one broadcast write)
_INTS = ("batch_size", "num_running", "tokens", "tokens_emitted", "decodes", "padded_batch",
         "block_size", "held_extra", "live_at_0", "live_per_row", "num_waiting",
         "kv_blocks_used")
_CONSTANTS = 10
# a decode run's ints: its first row and steps, decodes, padded batch, block size, live
# tokens at row 0 of the block (by the rule live = a + b x row)
_RUN_INTS = ("first", "steps", "decodes", "padded_batch", "block_size", "live_at_0")
COLUMNS = (*_INTS[:6], "num_waiting", "kv_blocks_used", "kv_held", "kv_live")


class StepBuffer:
    """Up to `capacity` recorded steps, `size` of them filled; take() empties it."""

    __slots__ = ("capacity", "size", "_rows", "_row_at", "_run_arrays", "_run_ints")

    def __init__(self, capacity: int = 8192) -> None:
        self.capacity, self.size = capacity, 0
        self._rows: list[tuple[float | int, ...]] = []  # single steps
        self._row_at: list[int] = []
        # decode runs: start_s, duration_s, num_waiting and kv_blocks_used of each, and
        # _RUN_INTS of each
        self._run_arrays: list[np.ndarray] = []
        self._run_ints = array("q")

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def room(self) -> int:
        return self.capacity - self.size

    def append(self, start_s: float, duration_s: float, batch_size: int, num_running: int,
               tokens: int, tokens_emitted: int, decodes: int, padded_batch: int,
               num_waiting: int, kv_blocks_used: int, kv_held: int, kv_live: int) -> None:
        """One step (the caller takes the block when `full`)."""
        self._row_at.append(self.size)
        self._rows.append((start_s, duration_s, batch_size, num_running, tokens,
                           tokens_emitted, decodes, padded_batch, 0, kv_held, kv_live, 0,
                           num_waiting, kv_blocks_used))
        self.size += 1

    def append_run(self, start_s: np.ndarray, duration_s: np.ndarray, num_waiting: np.ndarray,
                   kv_blocks_used: np.ndarray, decodes: int, padded_batch: int,
                   block_size: int, live_first: int) -> None:
        """Decode steps (at most room()) of `decodes` sequences each: batch, running,
        tokens and tokens emitted are all `decodes`, KV held = blocks x block size, and
        live tokens `live_first + decodes * s` at step s from 0. The arrays are read at
        take(), not copied: the caller leaves them as they are."""
        k, steps = self.size, len(duration_s)
        self._run_arrays.extend((start_s, duration_s, num_waiting, kv_blocks_used))
        self._run_ints.extend((k, steps, decodes, padded_batch, block_size,
                               live_first - decodes * k))
        self.size = k + steps

    def take(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """The filled rows as (start_s, duration_s, int columns by COLUMNS' names), and
        empty the buffer (the arrays are the caller's)."""
        k = self.size
        floats = np.empty((2, k))  # a column a row: each one contiguous
        ints = np.empty((len(_INTS), k), dtype=np.int64)
        if self._run_arrays:
            arrays = self._run_arrays
            first, lengths, n, padded, block_size, live_at_0 = np.frombuffer(
                self._run_ints, dtype=np.int64).reshape(-1, len(_RUN_INTS)).T
            # the runs' rows: all of them unless single steps lie between
            at: slice | np.ndarray = slice(None) if not self._rows else np.repeat(
                first - (np.cumsum(lengths) - lengths), lengths) + np.arange(
                    int(lengths.sum()))
            floats[0, at] = np.concatenate(arrays[0::4])
            floats[1, at] = np.concatenate(arrays[1::4])
            per_run = np.repeat(np.stack((n, padded, block_size, live_at_0)), lengths, axis=1)
            ints[:5, at] = per_run[0]  # batch size, running, tokens, emitted, decodes
            ints[5, at], ints[6, at] = per_run[1], per_run[2]
            ints[7, at] = 0  # held_extra
            ints[8, at], ints[9, at] = per_run[3], per_run[0]
            ints[_CONSTANTS, at] = np.concatenate(arrays[2::4])
            ints[_CONSTANTS + 1, at] = np.concatenate(arrays[3::4])
            self._run_arrays, self._run_ints = [], array("q")
        if self._rows:
            rows = np.array(self._rows).T  # ints below 2**53 go through float64 exactly
            at = np.array(self._row_at)
            floats[:, at] = rows[:2]
            ints[:, at] = rows[2:]
            self._rows, self._row_at = [], []
        self.size = 0
        c = dict(zip(_INTS, ints, strict=True))
        c["kv_held"] = c["kv_blocks_used"] * c.pop("block_size") + c.pop("held_extra")
        c["kv_live"] = c.pop("live_at_0") + c.pop("live_per_row") * np.arange(k)
        return floats[0], floats[1], c
