"""Paged attention for prefill, decode and mixed steps, reading each sequence's own blocks.

Each step's new K/V are written at their slots first; then every query row
attends to its sequence's cached context plus its own chunk, causally. Which
rows are where is known on the host (`StepInputs.spans`, from `build_inputs`),
so no layer reads a device value back. Two backends, picked per device by
`attention_backend`:

- "triton" (CUDA): one kernel reads the paged cache in place through the
  block table (gpu_engine/triton_attention.py): no copy of K/V at all.
- "torch" (the CPU; CUDA without Triton; gpu_engine/torch_attention.py): SDPA
  over a gather of exactly the live blocks of the cached sequences, never a
  dense copy padded to the widest table. Decodes with equally many live
  blocks form one batched call (grouped-query heads folded into the query
  axis: the G query heads that share a KV head are G query rows of that head,
  so K and V are never repeated); a chunk on a cached prefix is one masked
  call over its blocks.

On both, a prefill with no cached prefix is one causal SDPA call over its own
new tokens (flash on CUDA): it needs no cache read and no mask.
"""

from __future__ import annotations

import importlib.util

import torch

from gpu_engine.inputs import SeqSpan, StepInputs
from gpu_engine.kv_cache import write_kv
from gpu_engine.torch_attention import torch_attention

PrefillLayout = tuple[SeqSpan, ...]  # kept for callers that pass a layout to every layer


def attention_backend(device: torch.device | str, sliding_window: int = 0) -> str:
    """"triton" where its kernel can run (CUDA with Triton installed), else "torch"; a model
    with sliding-window layers takes "torch", whose masks know the window."""
    if (torch.device(device).type == "cuda" and not sliding_window
            and importlib.util.find_spec("triton") is not None):
        return "triton"
    return "torch"


def prefill_layout(inputs: StepInputs) -> PrefillLayout:
    """Where each sequence's rows are: host values already in `inputs` (no device read)."""
    return inputs.spans


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, inputs: StepInputs, scale: float,
                    layout: PrefillLayout | None = None, window: int = 0) -> torch.Tensor:
    """q (T, Hq, D), k/v (T, Hkv, D) of the new tokens -> out (T, Hq, D).

    Writes k/v into the caches at inputs.slot_mapping first, then each query
    token attends to its sequence's cached context plus its own chunk's tokens
    causally (position <= its own). `layout` is accepted for older callers and
    unused: the host layout travels in `inputs`. A sliding-window layer (`window` > 0)
    sees only its last `window` positions; the Triton kernel has no window yet, so such
    models run on the torch backend (attention_backend).
    """
    write_kv(k, v, k_cache, v_cache, inputs.slot_mapping)
    if inputs.backend == "triton":
        if window:
            raise ValueError("sliding-window attention needs the torch backend")
        from gpu_engine.triton_attention import triton_attention

        return triton_attention(q, k, v, k_cache, v_cache, inputs, scale)
    return torch_attention(q, k, v, k_cache, v_cache, inputs, scale, window)
