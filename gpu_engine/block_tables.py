"""Every running sequence's block table in one persistent tensor, updated by deltas.

A sequence keeps its row from step to step, and a step writes only the block
ids its sequences gained since the last step (usually none: a block holds 16
tokens), instead of flattening every table anew. The attention kernel reads a
sequence's blocks through its row (`StepInputs.table_rows`), so a CUDA graph
captured over this tensor reads whatever the latest deltas wrote.

Rows are keyed by request id. Whether a row is still right is decided by the
table alone: the plan's tuple is compared with the one stored (identity first,
then the stored prefix, in C), so a preempted request that comes back with new
blocks, or an id reused by a fresh scheduler, rewrites its row; nothing needs
telling. Row 0 is the null row (all `NULL_BLOCK`), read by padding rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sim.core.kv import NULL_BLOCK

NULL_ROW = 0


class BlockTableStore:
    """`table` (rows, max_blocks) int32 on the device; `update` hands out rows and deltas.

    `growable`: a table wider than `max_blocks`, or more live sequences than rows,
    reallocates (a draft model's store); otherwise that is an error, since a
    captured graph holds the tensor's address.
    """

    def __init__(self, num_rows: int, max_blocks: int, device: torch.device | str,
                 growable: bool = False) -> None:
        if num_rows < 2 or max_blocks < 1:
            raise ValueError(f"BlockTableStore: need >= 2 rows and >= 1 block per row, got "
                             f"{num_rows} rows of {max_blocks}")
        self.device = torch.device(device)
        self.growable = growable
        self.table = torch.full((num_rows, max_blocks), NULL_BLOCK, dtype=torch.int32,
                                device=self.device)
        self._rows: dict[int, int] = {}  # request id -> row
        self._known: list[tuple[int, ...]] = [()] * num_rows  # what each row holds
        self._owner: list[int | None] = [None] * num_rows
        self._used_at: list[int] = [0] * num_rows
        self._free = list(range(num_rows - 1, NULL_ROW, -1))
        self._step = 0

    @property
    def num_rows(self) -> int:
        return self.table.shape[0]

    @property
    def max_blocks(self) -> int:
        return self.table.shape[1]

    def update(self, seq_ids: Sequence[int | None], tables: Sequence[Sequence[int]]
               ) -> tuple[list[int], list[int], list[int]]:
        """(row of each sequence, flat indices into `table`, block ids to write there).

        A `None` id is a padding row: it reads the null row and holds none.
        """
        self._step += 1
        widest = max((len(t) for t in tables), default=0)
        if widest > self.max_blocks:
            self._grow(self.num_rows, widest)
        rows: list[int] = []
        index: list[int] = []
        values: list[int] = []
        for seq_id, table in zip(seq_ids, tables, strict=True):
            if seq_id is None:
                rows.append(NULL_ROW)
                continue
            row = self._rows.get(seq_id)
            if row is None:
                row = self._take(seq_ids)
                self._rows[seq_id] = row
                self._owner[row] = seq_id
            self._used_at[row] = self._step
            known = self._known[row]
            if table is not known:
                table = tuple(table)
                done = len(known)
                start = done if len(table) >= done and table[:done] == known else 0
                if start < len(table):
                    base = row * self.max_blocks
                    index.extend(range(base + start, base + len(table)))
                    values.extend(table[start:])
                self._known[row] = table
            rows.append(row)
        return rows, index, values

    def apply(self, index: torch.Tensor, values: torch.Tensor) -> None:
        """Write the deltas `update` returned (as device tensors): one kernel, no sync."""
        if index.numel():
            self.table.view(-1).index_copy_(0, index, values)

    def forget(self, seq_id: int) -> None:
        row = self._rows.pop(seq_id, None)
        if row is not None:
            self._owner[row] = None
            self._known[row] = ()
            self._free.append(row)

    def _take(self, in_step: Sequence[int | None]) -> int:
        if not self._free:
            busy = set(in_step)
            idle = [r for r in range(1, self.num_rows) if self._owner[r] not in busy]
            if idle:
                self.forget(self._owner[min(idle, key=self._used_at.__getitem__)])  # type: ignore[arg-type]
            else:
                self._grow(2 * self.num_rows, self.max_blocks)
        return self._free.pop()

    def _grow(self, num_rows: int, max_blocks: int) -> None:
        if not self.growable:
            raise ValueError(f"BlockTableStore: a step needs {max_blocks} blocks per row and "
                             f"{num_rows} rows; this store holds {self.max_blocks} x "
                             f"{self.num_rows} (size it from max_model_len and max_num_seqs)")
        old = self.table
        self.table = torch.full((num_rows, max_blocks), NULL_BLOCK, dtype=torch.int32,
                                device=self.device)
        self.table[:old.shape[0], :old.shape[1]] = old
        added = num_rows - old.shape[0]
        self._known += [()] * added
        self._owner += [None] * added
        self._used_at += [0] * added
        self._free += range(num_rows - 1, old.shape[0] - 1, -1)
