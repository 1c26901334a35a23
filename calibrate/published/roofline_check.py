"""The roofline's terms, restricted to what a published kernel table measures.

`shape_dims` gives the fitted roofline (sim.latency.roofline_terms) a
measured fixture's kernel widths; the functions below it keep the previous,
unfitted roofline (one max over the stack at 60% / 80% of datasheet) for
before/after comparisons.

A measured table times pieces of a step (the linear-op stack, one attention
kernel), so the roofline is cut the same way: the same FLOPs and HBM bytes
as sim.latency.roofline.RooflineLatency, the same efficiencies and the same
max(compute, memory), with no step overhead, no all-reduce, no lm_head and
no attention in the stack, and attention per layer alone. Error is signed,
roofline / measured - 1: negative means the roofline is too fast.

The terms are written out here rather than read from RooflineLatency's
private fields so that ungated MLPs (phi-2), which ModelSpec cannot express,
are priced with two matrices instead of three; a test holds them equal to
RooflineLatency's for every gated shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibrate.published.kernels import AttentionShape
from calibrate.published.measured import ModelShape
from sim.config.catalogue import get_hardware
from sim.config.hardware import HardwareSpec
from sim.latency.roofline_terms import LayerDims

# The roofline before issue 20's fit: one max(compute, HBM) over the step at these shares of
# datasheet (kept to show what the fit changed; sim.latency.roofline is the fitted one).
PREVIOUS_COMPUTE_EFFICIENCY = 0.6
PREVIOUS_BANDWIDTH_EFFICIENCY = 0.8

# The catalogue entry each measured device name stands for (both sources' H100s are SXM).
DEVICE_HARDWARE = {"h100": "h100-sxm", "a100": "a100-80gb"}


def device_hardware(device: str) -> HardwareSpec:
    if device not in DEVICE_HARDWARE:
        raise ValueError(f"no catalogue GPU for measured device {device!r}; "
                         f"known: {', '.join(DEVICE_HARDWARE)}")
    return get_hardware(DEVICE_HARDWARE[device])


@dataclass(frozen=True, slots=True)
class Efficiencies:
    compute: float = PREVIOUS_COMPUTE_EFFICIENCY
    bandwidth: float = PREVIOUS_BANDWIDTH_EFFICIENCY


def _kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    return max(1, kv_heads // tp)


def shape_dims(shape: ModelShape, tp: int) -> LayerDims:
    """One GPU's kernel widths of `shape` at `tp` (KV heads replicated past their count)."""
    return LayerDims(shape.num_layers, shape.hidden, shape.heads * shape.head_dim // tp,
                     _kv_heads_per_gpu(shape.kv_heads, tp) * shape.head_dim,
                     shape.intermediate / tp, 2 if shape.gated else 1, shape.vocab / tp)


def attention_dims(attn: AttentionShape) -> tuple[float, float]:
    """FLOPs per query-key pair and KV bytes per token of one layer on one GPU (bf16)."""
    return _attention_per_layer(attn)


def layer_params_per_gpu(shape: ModelShape, tp: int) -> float:
    """One layer's matmul weights plus its two norms on one GPU."""
    h = shape.hidden
    q_dim = shape.heads * shape.head_dim
    kv_dim = _kv_heads_per_gpu(shape.kv_heads, tp) * shape.head_dim
    mlp_matrices = 3 if shape.gated else 2
    return 2 * h * q_dim / tp + 2 * h * kv_dim + mlp_matrices * h * shape.intermediate / tp + 2 * h


def linear_stack_terms(shape: ModelShape, tp: int, rows: int,
                       dtype_bytes: float = 2) -> tuple[float, float]:
    """FLOPs and HBM bytes of every layer's linear ops over `rows` token rows, one GPU."""
    params = shape.num_layers * layer_params_per_gpu(shape, tp)
    q_kv = (shape.heads / tp + 2 * _kv_heads_per_gpu(shape.kv_heads, tp)) * shape.head_dim
    mlp = (3 if shape.gated else 2) * shape.intermediate / tp
    act_bytes_per_row = shape.num_layers * (4 * shape.hidden + q_kv + mlp) * dtype_bytes
    return 2 * params * rows, params * dtype_bytes + rows * act_bytes_per_row


def _roofline_s(flops: float, num_bytes: float, hw: HardwareSpec, eff: Efficiencies) -> float:
    return max(flops / (hw.bf16_flops_per_s * eff.compute),
               num_bytes / (hw.memory_bandwidth_bytes_per_s * eff.bandwidth))


def linear_stack_s(shape: ModelShape, tp: int, rows: int, hw: HardwareSpec,
                   eff: Efficiencies = Efficiencies()) -> float:
    return _roofline_s(*linear_stack_terms(shape, tp, rows), hw, eff)


def _attention_per_layer(attn: AttentionShape) -> tuple[float, float]:
    """FLOPs per query-key pair and KV bytes per token, one layer on one GPU (bf16)."""
    flops_per_pair = 4 * attn.q_heads / attn.tp * attn.head_dim
    kv_bytes_per_token = 2 * _kv_heads_per_gpu(attn.kv_heads, attn.tp) * attn.head_dim * 2
    return flops_per_pair, kv_bytes_per_token


def decode_attention_s(attn: AttentionShape, batch: int, kv_tokens: int, hw: HardwareSpec,
                       eff: Efficiencies = Efficiencies()) -> float:
    """`batch` decodes over `kv_tokens` each: reads the cache, writes one token, attends to it."""
    per_pair, per_token = _attention_per_layer(attn)
    return _roofline_s(batch * (kv_tokens + 1) * per_pair,
                       batch * (kv_tokens + 1) * per_token, hw, eff)


def prefill_attention_s(attn: AttentionShape, chunk_tokens: int, context_tokens: int,
                        hw: HardwareSpec, eff: Efficiencies = Efficiencies()) -> float:
    """A chunk after its context: chunk x context pairs plus the causal triangle."""
    per_pair, per_token = _attention_per_layer(attn)
    pairs = chunk_tokens * context_tokens + chunk_tokens * (chunk_tokens + 1) / 2
    return _roofline_s(pairs * per_pair, (context_tokens + chunk_tokens) * per_token, hw, eff)


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """Signed relative errors (roofline / measured - 1) of one group of rows."""

    n: int
    median: float
    p95_abs: float  # 95th percentile of |error|
    worst: float  # the error of largest magnitude, sign kept
    worst_at: int  # the x (token rows, batch...) where it occurs

    @classmethod
    def of(cls, errors: Sequence[float], at: Sequence[int]) -> ErrorSummary:
        e = np.asarray(errors, dtype=float)
        if e.size == 0:
            raise ValueError("no errors to summarise")
        i = int(np.argmax(np.abs(e)))
        return cls(int(e.size), float(np.median(e)), float(np.percentile(np.abs(e), 95)),
                   float(e[i]), int(at[i]))
