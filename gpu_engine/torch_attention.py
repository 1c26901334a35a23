"""The torch backend of paged attention (gpu_engine/attention.py): SDPA over the live blocks.

Used on the CPU, and on CUDA without Triton. The cached sequences' live blocks
(exactly those, never a dense copy padded to the widest table) are gathered
once per layer; decodes with equally many live blocks form one batched call
with the grouped-query heads folded into the query axis (K and V are never
repeated); a chunk on a cached prefix is one masked call over its blocks; a
prefill with no cached prefix is one causal call over its own tokens, which
the Triton backend shares (`causal_attention`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpu_engine.inputs import StepInputs


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: float, window: int = 0) -> torch.Tensor:
    """A prefill with no cached prefix: q (n, Hq, D) over its own k/v (n, Hkv, D), causally
    (and, for a sliding-window layer, over at most the last `window` positions).

    K/V are expanded to the query heads (a copy of this chunk's K/V only) rather than
    relying on `enable_gqa`, so that CUDA's flash kernel takes the call whatever the build.
    """
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    num_new = q.shape[0]
    mask = None
    if window and num_new > window:
        mask = torch.ones(num_new, num_new, dtype=torch.bool,
                          device=q.device).tril().triu(1 - window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1).to(q.dtype),
                                         v.transpose(0, 1).to(q.dtype), attn_mask=mask,
                                         is_causal=mask is None, scale=scale)
    return out.transpose(0, 1)


def _chunk_over_context(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        context: int, scale: float, window: int = 0) -> torch.Tensor:
    """q (n, Hq, D) at positions context.. over keys/values (context + n, Hkv, D), causally;
    a sliding-window layer sees keys within `window` of each query (the blocks stay)."""
    num_new = q.shape[0]
    visible = torch.ones(num_new, context + num_new, dtype=torch.bool,
                         device=q.device).tril(context)
    if window:
        visible = visible.triu(context + 1 - window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1),
                                         values.transpose(0, 1), attn_mask=visible,
                                         scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, inputs: StepInputs, scale: float,
                    window: int = 0) -> torch.Tensor:
    """The torch backend (see the module docstring); the caches already hold k/v. `window`
    > 0: a sliding-window layer, masked to its last `window` positions."""
    spans = inputs.spans
    if len(spans) == 1 and spans[0].is_fresh:
        return causal_attention(q, k, v, scale, window)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    keys = values = None
    if inputs.live_blocks.numel():  # exactly the live blocks of every cached sequence
        keys = k_cache.index_select(0, inputs.live_blocks).flatten(0, 1)
        values = v_cache.index_select(0, inputs.live_blocks).flatten(0, 1)
    for g in inputs.decode_groups:
        rows = inputs.decode_rows[g.offset:g.offset + g.count]
        span = g.num_blocks * block_size
        live = slice(g.live_start, g.live_start + g.count * span)
        group_keys = keys[live].view(g.count, span, num_kv_heads, head_dim).transpose(1, 2)
        group_values = values[live].view(g.count, span, num_kv_heads, head_dim).transpose(1, 2)
        lens = inputs.decode_lens[g.offset:g.offset + g.count].view(-1, 1)
        visible = torch.arange(span, device=q.device) < lens
        if window:
            visible &= torch.arange(span, device=q.device) >= lens - window
        folded = q.index_select(0, rows).view(g.count, num_kv_heads, group, head_dim)
        attended = F.scaled_dot_product_attention(folded, group_keys, group_values,
                                                  attn_mask=visible.view(g.count, 1, 1, span),
                                                  scale=scale)
        out.index_copy_(0, rows, attended.reshape(g.count, num_heads, head_dim))
    for s in spans:
        if s.num_new == 1:
            continue
        rows = slice(s.start, s.start + s.num_new)
        if s.is_fresh:
            out[rows] = causal_attention(q[rows], k[rows], v[rows], scale, window)
        else:
            live = slice(s.live_start, s.live_start + s.kv_len)
            out[rows] = _chunk_over_context(q[rows], keys[live], values[live], s.context,
                                            scale, window)
    return out
