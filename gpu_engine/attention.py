"""Paged attention in plain PyTorch (SDPA) for prefill, decode and mixed steps.

Grouped-query heads are folded into the query axis: the G query heads that
share a KV head become G query rows of that head, so K and V are read once
per KV head and never repeated. Two paths:

- decode-only steps: one batched SDPA over K/V gathered through the block
  table into (B, max_blocks * block_size), masked by `seq_lens`. Shapes depend
  only on (B, max_blocks) and nothing reads a device value on the host, so a
  CUDA graph can capture it.
- steps with prefills: the one-token rows still go through the batched
  decode path; each prefill chunk attends to its cached prefix plus itself
  (causally) in its own SDPA call. This needs the chunk boundaries on the
  host: `prefill_layout` computes them once per step (one device sync) and
  the model passes the result to every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu_engine.inputs import StepInputs


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One multi-token sequence of a step: rows [start, start + num_new) of the packed batch."""

    seq: int
    start: int
    num_new: int
    context: int


@dataclass(frozen=True, slots=True)
class PrefillLayout:
    """Where the prefill chunks and the one-token rows of a mixed step are."""

    chunks: tuple[PrefillChunk, ...]
    decode_seqs: torch.Tensor  # (Bd,) int64 sequence indices of one-token rows
    decode_rows: torch.Tensor  # (Bd,) int64 their rows in the packed batch


def prefill_layout(inputs: StepInputs) -> PrefillLayout:
    """Chunk boundaries on the host, read once per step (this is the step's one sync)."""
    starts = inputs.query_start.tolist()
    contexts = inputs.context_lens.tolist()
    chunks, decode_seqs, decode_rows = [], [], []
    for seq in range(inputs.num_seqs):
        start, num_new = starts[seq], starts[seq + 1] - starts[seq]
        if num_new == 1:
            decode_seqs.append(seq)
            decode_rows.append(start)
        else:
            chunks.append(PrefillChunk(seq, start, num_new, contexts[seq]))
    device = inputs.query_start.device
    return PrefillLayout(tuple(chunks),
                         torch.tensor(decode_seqs, dtype=torch.int64).to(device),
                         torch.tensor(decode_rows, dtype=torch.int64).to(device))


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' K/V at their slots (padding rows land in the null block)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """(B, W) block ids -> (B, Hkv, W * block_size, D) keys or values."""
    batch, width = block_tables.shape
    _, block_size, num_kv_heads, head_dim = cache.shape
    rows = cache[block_tables.long()].view(batch, width * block_size, num_kv_heads, head_dim)
    return rows.transpose(1, 2)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One query token per sequence: q (B, Hq, D) over its cached tokens -> (B, Hq, D)."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    keys, values = _gather(k_cache, block_tables), _gather(v_cache, block_tables)
    span = keys.shape[2]
    visible = torch.arange(span, device=q.device) < seq_lens.view(batch, 1).to(torch.int64)
    folded = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(folded, keys, values,
                                         attn_mask=visible.view(batch, 1, 1, span), scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_table: torch.Tensor, context: int, scale: float) -> torch.Tensor:
    """A chunk q (n, Hq, D) at positions context.. over its prefix and itself, causally."""
    num_new, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    span = context + num_new
    blocks = block_table[: -(-span // block_size)].view(1, -1)
    keys = _gather(k_cache, blocks)[0, :, :span]
    values = _gather(v_cache, blocks)[0, :, :span]
    # (n, Hkv, G, D) -> (Hkv, G * n, D): row g * n + j is query head g of token j
    folded = q.reshape(num_new, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    folded = folded.reshape(num_kv_heads, group * num_new, head_dim)
    query_pos = torch.arange(context, span, device=q.device).repeat(group)
    visible = torch.arange(span, device=q.device).view(1, span) <= query_pos.view(-1, 1)
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=visible, scale=scale)
    out = out.view(num_kv_heads, group, num_new, head_dim).permute(2, 0, 1, 3)
    return out.reshape(num_new, num_heads, head_dim)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, inputs: StepInputs, scale: float,
                    layout: PrefillLayout | None = None) -> torch.Tensor:
    """q (T, Hq, D), k/v (T, Hkv, D) of the new tokens -> out (T, Hq, D).

    Writes k/v into the caches at inputs.slot_mapping first, then each query
    token attends to its sequence's cached context plus its own chunk's tokens
    causally (position <= its own). `layout` (from `prefill_layout`) saves a
    host sync per layer on steps with prefills; it is computed when omitted.
    """
    write_kv(k, v, k_cache, v_cache, inputs.slot_mapping)
    if inputs.is_decode_only:
        return decode_attention(q, k_cache, v_cache, inputs.block_tables, inputs.seq_lens,
                                scale)
    if layout is None:
        layout = prefill_layout(inputs)
    out = torch.empty_like(q)
    if layout.decode_rows.numel():
        decoded = decode_attention(q[layout.decode_rows], k_cache, v_cache,
                                   inputs.block_tables[layout.decode_seqs],
                                   inputs.seq_lens[layout.decode_seqs], scale)
        out.index_copy_(0, layout.decode_rows, decoded)
    for chunk in layout.chunks:
        rows = slice(chunk.start, chunk.start + chunk.num_new)
        out[rows] = chunk_attention(q[rows], k_cache, v_cache, inputs.block_tables[chunk.seq],
                                    chunk.context, scale)
    return out
