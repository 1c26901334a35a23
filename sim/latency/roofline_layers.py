"""What one GPU's layers multiply: each group of alike layers' GEMMs, the bytes their
weights are stored in and the tensor-core rate they compute at.

Why groups: the fitted GEMM law (sim.latency.roofline_terms) prices one GEMM at a time,
and the models served today are not one layer repeated. DeepSeek-V3's first layers have
a dense MLP and the rest routed experts beside a shared one; MLA projects q and the KV
latent through low-rank pairs; gpt-oss keeps attention in bf16 and its experts in MXFP4.
A group lists its layers' GEMMs over every row (attention, dense MLP, router, shared
experts) apart from the routed experts' (run once per touched expert, over its rows), each
with its own dtype. A bf16 Llama is one group of the four GEMMs the fit was made on.
"""

from __future__ import annotations

from typing import NamedTuple

from sim.config.dtypes import DType
from sim.config.hardware import HardwareSpec
from sim.config.specs import ModelSpec, kv_heads_per_gpu
from sim.latency.roofline_terms import LayerDims


class Gemm(NamedTuple):
    """A k x n weight on one GPU, stored at `weight_bytes` per element (scales included),
    multiplied at `flops_per_s` (its dtype's tensor-core rate; bf16's where none).

    `tile_scale` carries the fitted tile over to this dtype: bf16's tile rows are
    scaled so that a tile's compute keeps its share of the weight read, (weight bytes /
    activation bytes) x (this rate / bf16's). fp8 on fp8 tensor cores keeps bf16's tile
    (half the bytes at twice the rate); weight-only int4 at bf16's rate gets about a
    quarter of it, so its GEMMs stay memory-bound up to a few tens of rows, as W4A16
    kernels do, instead of turning compute-bound on bf16's tile at one row.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    k: float
    n: float
    weight_bytes: float
    flops_per_s: float
    tile_scale: float = 1.0


class LayerGroup(NamedTuple):
    """`layers` alike layers: `dense` GEMMs over every row, `experts` once per touched
    routed expert; `dims` sizes their small kernels (an MoE layer's MLP width is that of
    the experts a row runs through, together).

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    layers: int
    dims: LayerDims
    dense: tuple[Gemm, ...]
    experts: tuple[Gemm, ...] = ()


def model_dims(model: ModelSpec, tp: int) -> LayerDims:
    """One GPU's kernel widths; an MoE layer's MLP is one expert's (priced per expert)."""
    return LayerDims(model.num_layers, model.hidden_size, model.num_heads * model.head_dim // tp,
                     kv_heads_per_gpu(model, tp) * model.head_dim,
                     model.expert_intermediate_size / tp, 2, model.vocab_size / tp)


def attention_shapes(model: ModelSpec, tp: int) -> tuple[tuple[float, float], ...]:
    """(k, n) of one layer's attention projections on one GPU.

    GQA: fused q/k/v and the output. MLA (as vLLM shards it): q through an optional
    low-rank pair (the down-projection replicated), the replicated down-projection to the
    latent plus rope key, its up-projection to every head's nope key and value, the output.
    """
    if model.attention != "mla":
        return model_dims(model, tp).gemms[:2]
    h, heads = model.hidden_size, model.num_heads // tp
    qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
    rank = model.q_lora_rank
    q = ((h, rank), (rank, heads * qk_head)) if rank else ((h, heads * qk_head),)
    return (*q, (h, model.kv_lora_rank + model.qk_rope_head_dim),
            (model.kv_lora_rank, heads * (model.qk_nope_head_dim + model.v_head_dim)),
            (heads * model.v_head_dim, h))


def _mlp_shapes(hidden: int, width: float) -> tuple[tuple[float, float], ...]:
    """Gate+up fused, then down."""
    return (hidden, 2 * width), (width, hidden)


def _stored(shapes: tuple[tuple[float, float], ...], dtype: DType, act: DType,
            hw: HardwareSpec) -> tuple[Gemm, ...]:
    rate = hw.flops_per_s(dtype.compute)
    scale = (dtype.bytes_per_element / act.bytes_per_element) * (rate / hw.bf16_flops_per_s)
    return tuple(Gemm(k, n, dtype.bytes_per_element, rate, scale) for k, n in shapes)


def layer_groups(model: ModelSpec, hw: HardwareSpec, tp: int = 1, ep: int = 1,
                 routed: bool = True) -> tuple[LayerGroup, ...]:
    """The dense layers, then the MoE layers (either may be absent). Under expert
    parallelism (ep > 1) a GPU holds whole experts; under tp a 1/tp slice of each.
    `routed=False` leaves the routed experts out (a data-parallel rank: the lockstep
    group prices them, sim.latency.moe_dp_ep)."""
    m, h = model, model.hidden_size
    base = model_dims(m, tp)
    if m.attention == "mla":
        base = base._replace(
            q_dim=m.num_heads // tp * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            kv_dim=m.kv_lora_rank + m.qk_rope_head_dim)
    weights, act = m.weights, m.carrier
    attention = _stored(attention_shapes(m, tp), weights, act, hw)
    groups = []
    if m.num_layers - m.moe_layers:
        width = m.intermediate_size / tp
        groups.append(LayerGroup(m.num_layers - m.moe_layers,
                                 base._replace(intermediate=width),
                                 attention + _stored(_mlp_shapes(h, width), weights, act, hw)))
    if m.moe_layers:
        expert = m.expert_intermediate_size
        shared = m.num_shared_experts * expert / tp
        router = Gemm(h, m.num_experts, act.bytes_per_element, hw.bf16_flops_per_s)
        per_row = m.experts_per_token * expert / (ep if ep > 1 else tp) + shared
        groups.append(LayerGroup(
            m.moe_layers, base._replace(intermediate=per_row),
            attention + (router,) + (_stored(_mlp_shapes(h, shared), weights, act, hw)
                                     if shared else ()),
            _stored(_mlp_shapes(h, expert / (1 if ep > 1 else tp)), m.experts, act, hw)
            if routed else ()))
    return tuple(groups)
