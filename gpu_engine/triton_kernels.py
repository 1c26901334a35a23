"""The Triton source of gpu_engine/triton_attention.py's kernels (see its docstring).

Plain functions: `triton_attention` compiles them with `triton.jit` for CUDA
tensors, or wraps them for Triton's interpreter for CPU tensors (the tests).
This module imports Triton, so it is imported only where a kernel runs. No
`from __future__ import annotations`: Triton reads the `tl.constexpr`
annotations as objects.
"""

import triton.language as tl


def attention_kernel(Q, K, V, Out, PartAcc, PartMax, PartSum,
                     Tables, TableRows, SeqLens, QueryStart, Tiles, num_tiles,
                     scale, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh,
                     stride_ot, stride_oh, stride_table,
                     GROUP: tl.constexpr, TOKENS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                     NUM_SPLITS: tl.constexpr, DECODE: tl.constexpr):
    """One (query tile, KV head, split) program; see triton_attention.py."""
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE:
        seq = tile
        first = 0
    else:
        seq = tl.load(Tiles + tile)
        first = tl.load(Tiles + num_tiles + tile)
    q_start = tl.load(QueryStart + seq)
    num_new = tl.load(QueryStart + seq + 1) - q_start
    kv_len = tl.load(SeqLens + seq)
    context = kv_len - num_new
    table_row = tl.load(TableRows + seq).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    token = first + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < TOKENS * GROUP) & (token < num_new)
    dims = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + token).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    query_pos = context + token
    end = tl.minimum(kv_len, context + first + TOKENS)  # keys the tile's last row can see
    if NUM_SPLITS > 1:
        share = tl.cdiv(tl.cdiv(end, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * share
        hi = tl.minimum(end, lo + share)
    else:
        lo = 0
        hi = end
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        block = tl.load(Tables + table_row * stride_table + cols // PAGE, mask=col_ok,
                        other=0).to(tl.int64)
        slots = block * stride_kb + (cols % PAGE) * stride_ks + kv_head * stride_kh
        k = tl.load(K + slots[:, None] + dims[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(V + slots[:, None] + dims[None, :], mask=col_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        visible = col_ok[None, :] & (cols[None, :] <= query_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if NUM_SPLITS > 1:
        stat = (q_rows * (tl.num_programs(1) * GROUP) + head) * NUM_SPLITS + split
        tl.store(PartAcc + stat[:, None] * HEAD_DIM + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(PartMax + stat, m_i, mask=row_ok)
        tl.store(PartSum + stat, l_i, mask=row_ok)
    else:
        out = acc / tl.where(row_ok, l_i, 1.0)[:, None]
        tl.store(Out + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=row_ok[:, None])


def combine_kernel(PartAcc, PartMax, PartSum, Out, stride_ot, stride_oh,
                   NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                   HEAD_DIM: tl.constexpr):
    """One (decode row, query head): the splits' partial sums, weighted and normalised."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_P2)
    ok = splits < NUM_SPLITS
    base = (row.to(tl.int64) * tl.num_programs(1) + head) * NUM_SPLITS
    m = tl.load(PartMax + base + splits, mask=ok, other=float("-inf"))
    total = tl.load(PartSum + base + splits, mask=ok, other=0.0)
    weight = tl.exp(m - tl.max(m, 0))  # split 0 always saw a key: the max is finite
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.load(PartAcc + (base + splits)[:, None] * HEAD_DIM + dims[None, :],
                  mask=ok[:, None], other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(total * weight, 0)
    tl.store(Out + row * stride_ot + head * stride_oh + dims, out.to(Out.dtype.element_ty))
