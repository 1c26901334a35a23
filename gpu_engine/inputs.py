"""One step's model inputs: the scheduler's plan flattened into packed tensors.

Every sequence's new tokens are packed back to back (no per-sequence padding),
so a step of one 2k-token prefill chunk and 200 decodes costs 2200 rows, not
201 x 2k. Index arithmetic is done once here, in Python on the host, and each
field becomes one tensor; the kernels then need no host-side bookkeeping.

Positions past the end of a sequence's block table, and the dummy rows added
by `pad_seqs_to`, map to the null block: the engine uses that for warm-up and
CUDA-graph capture, and padding can never write into a block that holds data.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sim.core.kv import NULL_BLOCK


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Packed tensors for one forward step (T new tokens over B sequences)."""

    token_ids: torch.Tensor  # (T,) int64: new tokens of all sequences, packed in plan order
    positions: torch.Tensor  # (T,) int64: context + offset within the chunk
    slot_mapping: torch.Tensor  # (T,) int64: block_id * block_size + offset of each new K/V
    query_start: torch.Tensor  # (B+1,) int32: cumulative new-token counts
    seq_lens: torch.Tensor  # (B,) int32: context + new tokens (what each sequence attends over)
    context_lens: torch.Tensor  # (B,) int32
    block_tables: torch.Tensor  # (B, max_blocks) int32, padded with NULL_BLOCK
    logits_indices: torch.Tensor  # (E,) int64: row in T of the last new token of each emitter
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    is_decode_only: bool  # every sequence has exactly one new token


def _check_columns(new_token_ids: Sequence[Sequence[int]], context_tokens: Sequence[int],
                   block_tables: Sequence[Sequence[int]], emits_token: Sequence[bool],
                   block_size: int, pad_seqs_to: int | None) -> None:
    n = len(new_token_ids)
    if not n == len(context_tokens) == len(block_tables) == len(emits_token):
        raise ValueError(
            f"build_inputs: new_token_ids ({n}), context_tokens ({len(context_tokens)}), "
            f"block_tables ({len(block_tables)}) and emits_token ({len(emits_token)}) "
            "must have one entry per sequence")
    if n == 0:
        raise ValueError("build_inputs: a step needs at least one sequence")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if pad_seqs_to is not None and pad_seqs_to < n:
        raise ValueError(f"pad_seqs_to={pad_seqs_to} is smaller than the batch of {n} sequences")


def _append_slots(slots: list[int], table: Sequence[int], start: int, end: int,
                  block_size: int) -> None:
    """Slots of positions [start, end): one Python iteration per block touched, not per token."""
    pos = start
    while pos < end:
        index, offset = divmod(pos, block_size)
        run = min(end - pos, block_size - offset)
        block = table[index] if index < len(table) else NULL_BLOCK
        base = block * block_size + offset
        slots.extend(range(base, base + run))
        pos += run


def build_inputs(new_token_ids: Sequence[Sequence[int]], context_tokens: Sequence[int],
                 block_tables: Sequence[Sequence[int]], emits_token: Sequence[bool],
                 block_size: int, device: torch.device | str,
                 pad_seqs_to: int | None = None, pad_blocks_to: int | None = None) -> StepInputs:
    """Pack one step's sequences; `pad_seqs_to` adds dummy one-token rows that emit nothing.

    `pad_blocks_to` is a minimum block-table width (CUDA-graph buckets); the
    width is also at least what the longest sequence needs.
    """
    _check_columns(new_token_ids, context_tokens, block_tables, emits_token, block_size,
                   pad_seqs_to)
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts: list[int] = [0]
    seq_lens: list[int] = []
    logits_rows: list[int] = []
    total = 0
    for ids, context, table, emits in zip(new_token_ids, context_tokens, block_tables,
                                          emits_token, strict=True):
        num_new = len(ids)
        if num_new == 0 or context < 0:
            raise ValueError(f"build_inputs: sequence {len(seq_lens)} has {num_new} new tokens "
                             f"and context {context}; need >= 1 new token and context >= 0")
        end = context + num_new
        tokens.extend(ids)
        if num_new == 1:  # decode: the common row, kept free of calls
            positions.append(context)
            index, offset = divmod(context, block_size)
            slots.append((table[index] if index < len(table) else NULL_BLOCK) * block_size
                         + offset)
        else:
            positions.extend(range(context, end))
            _append_slots(slots, table, context, end, block_size)
        total += num_new
        starts.append(total)
        seq_lens.append(end)
        if emits:
            logits_rows.append(total - 1)
    max_query = max(map(len, new_token_ids))
    width = max(pad_blocks_to or 0, max(map(len, block_tables)), -(-max(seq_lens) // block_size))
    contexts = list(context_tokens)
    padding = (pad_seqs_to or 0) - len(seq_lens)
    if padding > 0:
        tokens.extend([0] * padding)
        positions.extend([0] * padding)
        slots.extend([NULL_BLOCK * block_size] * padding)
        starts.extend(range(total + 1, total + padding + 1))
        seq_lens.extend([1] * padding)
        contexts.extend([0] * padding)
        max_query = max(max_query, 1)
    tables: list[int] = []
    for table in block_tables:
        tables.extend(table)
        tables.extend([NULL_BLOCK] * (width - len(table)))
    tables.extend([NULL_BLOCK] * (width * max(padding, 0)))
    num_seqs = len(seq_lens)

    def put(values: list[int], wide: bool) -> torch.Tensor:
        # array -> frombuffer is ~3x cheaper than torch.tensor(list) at thousands of entries
        dtype = torch.int64 if wide else torch.int32
        if not values:
            return torch.empty(0, dtype=dtype, device=device)
        host = torch.frombuffer(array("q" if wide else "i", values), dtype=dtype)
        return host.to(device, non_blocking=True)

    return StepInputs(
        token_ids=put(tokens, True),
        positions=put(positions, True),
        slot_mapping=put(slots, True),
        query_start=put(starts, False),
        seq_lens=put(seq_lens, False),
        context_lens=put(contexts, False),
        block_tables=put(tables, False).view(num_seqs, width),
        logits_indices=put(logits_rows, True),
        num_seqs=num_seqs,
        max_query_len=max_query,
        max_seq_len=max(seq_lens),
        is_decode_only=max_query == 1,
    )
