"""One step's model inputs: the scheduler's plan flattened into packed tensors.

Every sequence's new tokens are packed back to back (no per-sequence padding),
so a step of one 2k-token prefill chunk and 200 decodes costs 2200 rows, not
201 x 2k. Index arithmetic is done once here, in Python on the host, and all
fields go to the device in one pinned, non-blocking copy (gpu_engine/staging.py);
what the layers need to know on the host (where each sequence's rows are) is
kept here as plain values, so no layer ever reads a device value back.

Positions past the end of a sequence's block table, and the dummy rows added
by `pad_seqs_to`, map to the null block: the engine uses that for warm-up and
CUDA-graph capture, and padding can never write into a block that holds data.

What the attention reads depends on its backend (gpu_engine/attention.py):
- "torch": `live_blocks`, every cached sequence's live blocks (those holding its
  context and new tokens), decodes grouped by block count so that each group is
  one batched call; the attention copies exactly those blocks, no padding.
- "triton": block tables read in place, through `table_rows` into
  `block_tables` (the runner's persistent `BlockTableStore`, or this step's
  tables), and for steps with chunks `tiles`, the query tiles of the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_engine.block_tables import NULL_ROW, BlockTableStore
from gpu_engine.staging import stage
from sim.core.kv import NULL_BLOCK

BACKENDS = ("torch", "triton")
TILE_TOKENS = 16  # query tokens per kernel tile of a chunk (the runner sizes it per model)


@dataclass(frozen=True, slots=True)
class SeqSpan:
    """One sequence's rows in the packed batch and where its KV is (host values)."""

    seq: int
    start: int  # first row of its new tokens
    num_new: int
    context: int  # tokens in KV before the step
    live_start: int  # torch backend: its first token in the gathered live blocks

    @property
    def kv_len(self) -> int:
        return self.context + self.num_new

    @property
    def is_fresh(self) -> bool:
        """A prefill with no cached prefix: it attends to its own new tokens only."""
        return self.context == 0 and self.num_new > 1


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Decodes with the same number of live blocks: one batched call on the torch backend."""

    offset: int  # into decode_rows / decode_lens
    count: int
    num_blocks: int
    live_start: int  # first token of the group's blocks in the gathered live blocks


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Packed tensors for one forward step (T new tokens over B sequences)."""

    token_ids: torch.Tensor  # (T,) int64: new tokens of all sequences, packed in plan order
    positions: torch.Tensor  # (T,) int64: context + offset within the chunk
    slot_mapping: torch.Tensor  # (T,) int64: block_id * block_size + offset of each new K/V
    query_start: torch.Tensor  # (B+1,) int32: cumulative new-token counts
    seq_lens: torch.Tensor  # (B,) int32: context + new tokens (what each sequence attends over)
    table_rows: torch.Tensor  # (B,) int32: each sequence's row of block_tables (triton)
    logits_indices: torch.Tensor  # (E,) int64: row in T of the last new token of each emitter
    live_blocks: torch.Tensor  # (L,) int64: torch backend, cached sequences' live blocks
    decode_rows: torch.Tensor  # (D,) int64: torch backend, decode rows group by group
    decode_lens: torch.Tensor  # (D,) int64: their KV lengths
    tiles: torch.Tensor  # (2, N) int32: triton backend, (sequence, first new token) per tile
    block_tables: torch.Tensor  # (R, W) int32: triton backend, NULL_BLOCK-padded
    packed: torch.Tensor  # the uint8 device buffer every field above but block_tables views
    graph_bytes: int  # the prefix of `packed` a decode graph reads (before logits_indices)
    spans: tuple[SeqSpan, ...]
    decode_groups: tuple[DecodeGroup, ...]
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    is_decode_only: bool  # every sequence has exactly one new token
    backend: str = "torch"
    tile_tokens: int = TILE_TOKENS


def _check_columns(new_token_ids: Sequence[Sequence[int]], context_tokens: Sequence[int],
                   block_tables: Sequence[Sequence[int]], emits_token: Sequence[bool],
                   block_size: int, pad_seqs_to: int | None, backend: str) -> None:
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
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


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


def _live(table: Sequence[int], kv_len: int, block_size: int) -> list[int]:
    """The blocks holding positions [0, kv_len) (the null block past the table's end)."""
    count = -(-kv_len // block_size)
    live = list(table[:count])
    return live + [NULL_BLOCK] * (count - len(live))


def build_inputs(new_token_ids: Sequence[Sequence[int]], context_tokens: Sequence[int],
                 block_tables: Sequence[Sequence[int]], emits_token: Sequence[bool],
                 block_size: int, device: torch.device | str,
                 pad_seqs_to: int | None = None, *, backend: str = "torch",
                 store: BlockTableStore | None = None, seq_ids: Sequence[int] | None = None,
                 logits_rows: Sequence[int] | None = None,
                 tile_tokens: int = TILE_TOKENS) -> StepInputs:
    """Pack one step's sequences; `pad_seqs_to` adds dummy one-token rows that emit nothing.

    triton backend: with `store` and `seq_ids` the tables go to the persistent
    store (deltas only); without, this step's tables are flattened.
    `logits_rows`: rows whose logits are wanted, instead of each emitter's last
    (speculative verification wants every drafted position).
    """
    device = torch.device(device)
    _check_columns(new_token_ids, context_tokens, block_tables, emits_token, block_size,
                   pad_seqs_to, backend)
    torch_backend = backend == "torch"
    tokens: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts: list[int] = [0]
    seq_lens: list[int] = []
    logits: list[int] = []
    spans: list[SeqSpan] = []
    live: list[int] = []
    chunk_live: list[tuple[int, list[int]]] = []  # (span index, blocks) of cached chunks
    by_blocks: dict[int, list[int]] = {}  # decodes by live block count (torch backend)
    total = 0
    for seq, (ids, context, table, emits) in enumerate(zip(new_token_ids, context_tokens,
                                                           block_tables, emits_token,
                                                           strict=True)):
        num_new = len(ids)
        if num_new == 0 or context < 0:
            raise ValueError(f"build_inputs: sequence {seq} has {num_new} new tokens "
                             f"and context {context}; need >= 1 new token and context >= 0")
        end = context + num_new
        tokens.extend(ids)
        if num_new == 1:  # decode: the common row, kept free of calls
            positions.append(context)
            index, offset = divmod(context, block_size)
            slots.append((table[index] if index < len(table) else NULL_BLOCK) * block_size
                         + offset)
            if torch_backend:
                by_blocks.setdefault(-(-end // block_size), []).append(seq)
        else:
            positions.extend(range(context, end))
            _append_slots(slots, table, context, end, block_size)
            if torch_backend and context:
                chunk_live.append((seq, _live(table, end, block_size)))
        spans.append(SeqSpan(seq, total, num_new, context, 0))
        total += num_new
        starts.append(total)
        seq_lens.append(end)
        if emits:
            logits.append(total - 1)
    num_real = len(seq_lens)
    max_query = max(map(len, new_token_ids))
    max_seq = max(seq_lens)
    padding = (pad_seqs_to or 0) - num_real
    if padding > 0:
        tokens.extend([0] * padding)
        positions.extend([0] * padding)
        slots.extend([NULL_BLOCK * block_size] * padding)
        starts.extend(range(total + 1, total + padding + 1))
        seq_lens.extend([1] * padding)
        spans.extend(SeqSpan(num_real + i, total + i, 1, 0, 0) for i in range(padding))
        if torch_backend:
            by_blocks.setdefault(1, []).extend(range(num_real, num_real + padding))
        max_query = max(max_query, 1)
    num_seqs = len(seq_lens)
    if logits_rows is not None:
        logits = list(logits_rows)

    decode_rows: list[int] = []
    decode_lens: list[int] = []
    groups: list[DecodeGroup] = []
    for count, seqs in by_blocks.items():  # torch backend only
        groups.append(DecodeGroup(len(decode_rows), len(seqs), count, len(live) * block_size))
        for seq in seqs:
            span = spans[seq]
            decode_rows.append(span.start)
            decode_lens.append(span.kv_len)
            live.extend(_live(block_tables[seq], span.kv_len, block_size)
                        if seq < num_real else [NULL_BLOCK])
    for seq, blocks in chunk_live:
        s = spans[seq]
        spans[seq] = SeqSpan(s.seq, s.start, s.num_new, s.context, len(live) * block_size)
        live.extend(blocks)

    tiles: tuple[list[int], list[int]] = ([], [])
    rows: list[int] = []
    delta_index: list[int] = []
    delta_values: list[int] = []
    flat_tables: list[int] = []
    width = 0
    if not torch_backend:
        if max_query > 1:
            for span in spans:
                if not span.is_fresh:
                    for first in range(0, span.num_new, tile_tokens):
                        tiles[0].append(span.seq)
                        tiles[1].append(first)
        if store is not None and seq_ids is not None:
            rows, delta_index, delta_values = store.update(seq_ids, block_tables)
            rows += [NULL_ROW] * max(padding, 0)
        else:
            width = max(1, max(map(len, block_tables)), -(-max_seq // block_size))
            for table in block_tables:
                flat_tables.extend(table)
                flat_tables.extend([NULL_BLOCK] * (width - len(table)))
            flat_tables.extend([NULL_BLOCK] * (width * max(padding, 0)))
            rows = list(range(num_seqs))

    staged = stage([(tokens, torch.int64), (positions, torch.int64), (slots, torch.int64),
                    (starts, torch.int32), (seq_lens, torch.int32), (rows, torch.int32),
                    (logits, torch.int64), (live, torch.int64), (decode_rows, torch.int64),
                    (decode_lens, torch.int64), (tiles[0] + tiles[1], torch.int32),
                    (delta_index, torch.int64), (delta_values, torch.int32),
                    (flat_tables, torch.int32)], device)
    (token_t, pos_t, slot_t, start_t, len_t, row_t, logit_t, live_t, drow_t, dlen_t, tile_t,
     delta_i, delta_v, flat_t) = staged.views
    if torch_backend:
        tables_t = flat_t.view(0, 0)
    elif store is not None and seq_ids is not None:
        store.apply(delta_i, delta_v)
        tables_t = store.table
    else:
        tables_t = flat_t.view(num_seqs, width)
    return StepInputs(
        token_ids=token_t, positions=pos_t, slot_mapping=slot_t, query_start=start_t,
        seq_lens=len_t, table_rows=row_t, logits_indices=logit_t, live_blocks=live_t,
        decode_rows=drow_t, decode_lens=dlen_t, tiles=tile_t.view(2, -1),
        block_tables=tables_t, packed=staged.packed, graph_bytes=staged.offsets[6],
        spans=tuple(spans), decode_groups=tuple(groups), num_seqs=num_seqs,
        max_query_len=max_query, max_seq_len=max_seq, is_decode_only=max_query == 1,
        backend=backend, tile_tokens=tile_tokens)
