"""Steps waiting to be folded into the recorder's accumulators, a fixed block of rows.

Why: folding a step costs a microsecond or more in Python, numpy over many
steps a few nanoseconds each, and a decode run is often a handful of steps. So
the recorder writes each step (a row) or decode run (rows) here and folds the
block in bulk when it is full or read. Every accumulator takes the steps in
the order they were recorded, so the floats are those of folding them one by
one. Memory is the block's, fixed: `capacity` rows of 2 floats and 12 ints
(786 KiB at the default 8,192), allocated by the first decode run or fold.

A decode run's row is written with few numpy operations: its per-run values
are one broadcast row, and the KV slots held and live tokens, which grow by
rule along the run, are stored as that rule (held = blocks x block size + a
constant, live = a + b x row) and expanded when the block is taken.
"""

from __future__ import annotations

import numpy as np

# int columns: the first `_CONSTANTS` are constant along a decode run (one broadcast write)
_INTS = ("batch_size", "num_running", "tokens", "tokens_emitted", "decodes", "padded_batch",
         "block_size", "held_extra", "live_at_0", "live_per_row", "num_waiting",
         "kv_blocks_used")
_CONSTANTS = 10
COLUMNS = (*_INTS[:6], "num_waiting", "kv_blocks_used", "kv_held", "kv_live")
_EMPTY = np.empty((0, 0))


class StepBuffer:
    """Up to `capacity` recorded steps, `size` of them filled; take() empties it."""

    __slots__ = ("capacity", "size", "_floats", "_ints", "_rows", "_row_at")

    def __init__(self, capacity: int = 8192) -> None:
        self.capacity, self.size = capacity, 0
        self._floats = self._ints = _EMPTY  # allocated by the first run (see release)
        self._rows: list[tuple[float | int, ...]] = []  # single steps, written at take()
        self._row_at: list[int] = []

    def release(self) -> None:
        """Free the block while it is empty (a recorder that was read: a sweep may keep
        thousands); the next decode run allocates it again."""
        if not self.size:
            self._floats = self._ints = _EMPTY

    @property
    def full(self) -> bool:
        return self.size == self.capacity

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
        live tokens `live_first + decodes * s` at step s from 0."""
        k = self.size
        end = k + len(duration_s)
        if len(self._floats) < end:
            self._allocate()
        floats, ints = self._floats[k:end], self._ints[k:end]
        floats[:, 0], floats[:, 1] = start_s, duration_s
        n = decodes
        ints[:, :_CONSTANTS] = (n, n, n, n, n, padded_batch, block_size, 0,
                                live_first - n * k, n)
        ints[:, _CONSTANTS], ints[:, _CONSTANTS + 1] = num_waiting, kv_blocks_used
        self.size = end

    def _allocate(self) -> None:
        """The full block, keeping what the (empty or full-size) one held."""
        assert not len(self._floats), "a block is allocated whole"
        self._floats = np.empty((self.capacity, 2))
        self._ints = np.empty((self.capacity, len(_INTS)), dtype=np.int64)

    def take(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """The filled rows as (start_s, duration_s, int columns by COLUMNS' names), and
        empty the buffer (the arrays are the caller's)."""
        k = self.size
        if len(self._floats) < k:
            self._allocate()
        floats, ints = self._floats[:k], self._ints[:k]
        if self._rows:
            rows = np.array(self._rows)  # ints below 2**53 go through float64 exactly
            at = np.array(self._row_at)
            floats[at] = rows[:, :2]
            ints[at] = rows[:, 2:]
            self._rows, self._row_at = [], []
        self.size = 0
        c = {name: ints[:, j].copy() for j, name in enumerate(_INTS)}
        c["kv_held"] = c["kv_blocks_used"] * c.pop("block_size") + c.pop("held_extra")
        c["kv_live"] = c.pop("live_at_0") + c.pop("live_per_row") * np.arange(k)
        return floats[:, 0].copy(), floats[:, 1].copy(), c
