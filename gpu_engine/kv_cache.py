"""The paged KV cache: per-layer K and V tensors indexed by the block manager's block ids.

Block `b` holds tokens `b * block_size ... (b + 1) * block_size - 1` of the flat
slot space, so a token's slot is `block_id * block_size + offset` and writes
are one `index_copy_` per layer. Block 0 (the null block) is never handed out
by `sim.core`; padding rows write there. The cache starts zeroed so that
masked reads of never-written slots are finite (0 x NaN would poison softmax
outputs even with a zero weight).

The number of blocks comes from the simulator's own budget (sim.assemble.kv_budget,
one formula for both worlds), so the engine and the simulator size the same pool
from the same memory.
"""

from __future__ import annotations

import torch

from sim.config.specs import ModelSpec


class PagedKVCache:
    """Per-layer K and V tensors of shape (num_blocks, block_size, num_kv_heads, head_dim)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks),
                            ("block_size", block_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PagedKVCache: {name} must be a positive integer, "
                                 f"got {value!r}")
        if num_blocks < 2:
            raise ValueError(f"PagedKVCache: num_blocks={num_blocks} leaves no block besides "
                             "the null block; need at least 2")
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k: list[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device)
                                      for _ in range(num_layers)]
        self.v: list[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device)
                                      for _ in range(num_layers)]

    @classmethod
    def for_spec(cls, spec: ModelSpec, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str) -> PagedKVCache:
        """A cache shaped for `spec`; `num_blocks` includes the null block."""
        return cls(spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim,
                   dtype, device)

    def bytes_total(self) -> int:
        """Bytes held by every layer's K and V, null block included."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' K/V at their slots (padding rows land in the null block)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
