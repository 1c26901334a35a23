"""Paged attention as one Triton kernel that reads K/V in place through the block table.

A program takes one query tile of one sequence and one KV head: its rows are
(token, query head) pairs of the G query heads sharing that KV head, so each
K/V tile is loaded once per KV head and used by all G heads (grouped-query
attention without repeating K/V). It walks the sequence's KV positions
BLOCK_N at a time, each position's slot found through the block table (a
position's block is `table[pos // PAGE]`), with an online softmax in fp32.
Keys past a row's own position are masked (causal), so a decode, a chunk on a
cached prefix and a speculative verify are the same code.

Decode steps (one token per sequence) are memory bound and have few programs
at small batches, so the KV range of a sequence is split over `splits`
programs (split-KV); each writes its unnormalised partial sums, and a second
kernel combines them. The split length is computed in the kernel from the
sequence's own length, so the grid depends only on the batch (a CUDA graph
captures it once per batch bucket) and every split does a similar share.

Triton runs the same source on CPU tensors through its interpreter: that is
how the tests check this kernel against the fp64 reference without a GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpu_engine.inputs import StepInputs
from gpu_engine.kv_cache import write_kv
from gpu_engine.torch_attention import causal_attention

__all__ = ["decode_splits", "triton_attention", "write_kv"]

_BLOCK_N = 64  # KV positions per inner iteration
_WAVES = 4  # decode: aim for this many programs per multiprocessor
_MAX_SPLITS = 32


@functools.cache
def _kernels(on_cpu: bool) -> tuple[Any, Any]:
    """The two kernels, jitted (a pure memo). Under TRITON_INTERPRET=1, set before Triton is
    first imported, `triton.jit` gives the interpreter's version, which runs CPU tensors."""
    import triton

    from gpu_engine.triton_kernels import attention_kernel, combine_kernel

    if on_cpu and not triton.knobs.runtime.interpret:
        raise RuntimeError("the triton attention backend runs CPU tensors only in Triton's "
                           "interpreter: set TRITON_INTERPRET=1 before triton is imported")
    return (triton.jit(attention_kernel, do_not_specialize=["num_tiles"]),
            triton.jit(combine_kernel))


def decode_splits(batch: int, num_kv_heads: int, device: torch.device) -> int:
    """How many programs share one decode sequence's KV: enough to fill the GPU, a power of
    two (fewer kernel variants to compile). On CPU tensors (the interpreter) one."""
    if device.type != "cuda":
        return 1
    target = _WAVES * torch.cuda.get_device_properties(device).multi_processor_count
    want = min(_MAX_SPLITS, -(-target // (batch * num_kv_heads)))
    return 1 << max(0, want - 1).bit_length() if want > 1 else 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
            inputs: StepInputs, scale: float, decode: bool, splits: int) -> None:
    num_heads, head_dim = q.shape[1:]
    _, page, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    tokens = 1 if decode else inputs.tile_tokens
    block_m = max(16, _next_pow2(tokens * group))
    num_tiles = inputs.num_seqs if decode else inputs.tiles.shape[1]
    attend, combine = _kernels(q.device.type != "cuda")
    if splits > 1:
        stats = (q.shape[0], num_heads, splits)
        part_acc = torch.empty((*stats, head_dim), dtype=torch.float32, device=q.device)
        part_max = torch.empty(stats, dtype=torch.float32, device=q.device)
        part_sum = torch.empty(stats, dtype=torch.float32, device=q.device)
    else:
        part_acc = part_max = part_sum = out  # unused
    table = inputs.block_tables
    attend[(num_tiles, num_kv_heads, splits)](
        q, k_cache, v_cache, out, part_acc, part_max, part_sum,
        table, inputs.table_rows, inputs.seq_lens, inputs.query_start, inputs.tiles, num_tiles,
        scale, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), out.stride(0), out.stride(1), table.stride(0),
        GROUP=group, TOKENS=tokens, BLOCK_M=block_m, BLOCK_N=_BLOCK_N, HEAD_DIM=head_dim,
        PAGE=page, NUM_SPLITS=splits, DECODE=decode)
    if splits > 1:
        combine[(q.shape[0], num_heads)](part_acc, part_max, part_sum, out, out.stride(0),
                                         out.stride(1), NUM_SPLITS=splits,
                                         SPLITS_P2=_next_pow2(splits), HEAD_DIM=head_dim)


def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, inputs: StepInputs, scale: float,
                     splits: int | None = None) -> torch.Tensor:
    """q (T, Hq, D) over each sequence's cached context and its own chunk; the caches already
    hold this step's k/v. `splits`: split-KV programs per decode sequence (None = enough to
    fill the device)."""
    out = torch.empty_like(q)
    if inputs.is_decode_only:
        if q.stride(-1) != 1:
            q = q.contiguous()
        if splits is None:
            splits = decode_splits(inputs.num_seqs, k_cache.shape[2], q.device)
        _launch(q, k_cache, v_cache, out, inputs, scale, True, splits)
        return out
    if inputs.tiles.shape[1]:
        _launch(q.contiguous(), k_cache, v_cache, out, inputs, scale, False, 1)
    for s in inputs.spans:
        if s.is_fresh:
            rows = slice(s.start, s.start + s.num_new)
            out[rows] = causal_attention(q[rows], k[rows], v[rows], scale)
    return out
