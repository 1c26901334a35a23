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
block in a few numpy operations: its per-run values are one row repeated over its steps, and
the KV slots held and live tokens, which grow by rule along the run, are stored
as that rule (held = blocks x block size + a constant, live = a + b x row) and
expanded then.
"""

from __future__ import annotations

from array import array
from itertools import chain

import numpy as np

# int columns: the first `_CONSTANTS` are constant along a decode run (one row, repeated)
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
        empty the buffer (the arrays are the caller's).

        Runs and single steps are segments of rows in the order recorded: the constant
        columns repeat each segment's values over its rows (one np.repeat), and the four
        that vary along a run are gathered from the runs' arrays and the single steps'
        values (no scatter: numpy's fancy assignment costs ~25 instructions an element).
        """
        k = self.size
        runs = np.frombuffer(self._run_ints, dtype=np.int64).reshape(-1, len(_RUN_INTS))
        # single steps: _row's fields; ints below 2**53 go through float64 exactly (fromiter
        # over the fields: a quarter fewer instructions than np.array's nested discovery)
        rows = np.fromiter(chain.from_iterable(self._rows), np.float64,
                           14 * len(self._rows)).reshape(-1, 14)
        first = np.concatenate((runs[:, 0], self._row_at)).astype(np.int64)
        lengths = np.concatenate((runs[:, 1], np.ones(len(rows), dtype=np.int64)))
        constants = np.empty((len(first), _CONSTANTS), dtype=np.int64)
        n = runs[:, 2]  # a run's batch size, running, tokens, emitted, decodes
        constants[:len(runs)] = np.stack((n, n, n, n, n, runs[:, 3], runs[:, 4],
                                          np.zeros_like(n), runs[:, 5], n), axis=1)
        constants[len(runs):] = rows[:, 2:2 + _CONSTANTS]
        varying = [np.concatenate((*self._run_arrays[j::4], rows[:, column]))
                   for j, column in enumerate((0, 1, 12, 13))]
        if len(runs) and len(rows):  # interleaved: each row's place in `varying`
            order = first.argsort(kind="stable")
            source = lengths.cumsum() - lengths  # where a segment's values start
            at = (source[order] - first[order]).repeat(lengths[order]) + np.arange(k)
            constants, lengths = constants[order], lengths[order]
            varying = [column.take(at) for column in varying]
        ints = np.empty((len(_INTS), k), dtype=np.int64)
        ints[:_CONSTANTS] = constants.repeat(lengths, axis=0).T  # a row at a time
        ints[_CONSTANTS], ints[_CONSTANTS + 1] = varying[2], varying[3]
        self._rows, self._row_at, self._run_arrays, self._run_ints = [], [], [], array("q")
        self.size = 0
        c = dict(zip(_INTS, ints, strict=True))
        c["kv_held"] = c["kv_blocks_used"] * c.pop("block_size") + c.pop("held_extra")
        c["kv_live"] = c.pop("live_at_0") + c.pop("live_per_row") * np.arange(k)
        return varying[0], varying[1], c
