"""Roofline step latency: max(compute time, HBM time) plus fixed and collective costs.

Needs nothing but a ModelSpec and a HardwareSpec, so it is the default when no
calibration table exists. Prefill turns out compute-bound and decode
memory-bound because of the shapes, not because of any special case: a step
reads the weights once however many tokens it computes.

Bytes are the bytes stored: each part of the weights in its own dtype (scales
included), the KV cache in kv_dtype, activations in bf16. Matmul FLOPs run at the
weight dtype's tensor-core rate where the GPU has one (fp8 weights on an H100 at twice
bf16's rate; weight-only int4 at bf16's); attention and lm_head at bf16's. A
sliding-window layer attends to and reads at most its window per sequence.

Swap preemption's KV transfers (StepShape.swap_*_tokens) go over the host link
and are added to the step that carries them: kernels wait for swapped-in KV,
and a swap-out must finish before its blocks are overwritten.

A MoE step reads the distinct experts its rows touch (sim.config.moe's closed form,
with the model's routing_skew); under expert parallelism (`ep`) each GPU holds whole
experts, reads its share, and every MoE layer pays an all-to-all (dispatch and combine)
in place of its MLP all-reduce, counted with the collectives (`allreduce_s`).

A speculative verify (StepShape.num_spec_tokens > 0) runs the target over
1 + k_i positions of each drafting sequence: k_i more matmul rows, logits and
KV writes each, and the drafts' attention over the cached context plus the
causal pairs among the new positions (k taken as the step's mean k_i). The
KV is read once per sequence however many positions verify, which is why a
memory-bound decode verifies drafts almost for free. The draft's own passes
are priced by sim.latency.draft.SpeculativeLatency around this model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.config.attention import attended_tokens
from sim.config.costs import (
    activation_elements_per_token,
    allreduce_time_s,
    attention_flops_per_pair,
    expert_weight_bytes,
    experts_touched,
    kv_bytes_per_token,
    linear_compute_s_per_token,
    linear_flops_per_token,
    lm_head_flops_per_seq,
    weights_read_bytes,
)
from sim.config.moe import all_to_all_bytes_per_gpu
from sim.config.specs import HardwareSpec, ModelSpec, check_ep, check_tp
from sim.core.plan import StepShape

# Per step: scheduler, input prep, sampling and launch gaps of a vLLM-class engine
# measure ~1-3 ms outside the kernels; calibration replaces this guess.
DEFAULT_STEP_OVERHEAD_S = 2e-3
# Large bf16 GEMMs reach 60-75% of dense peak; attention and small shapes less.
DEFAULT_COMPUTE_EFFICIENCY = 0.6
# Streaming weight and KV reads reach 80-90% of datasheet HBM bandwidth.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
# Fixed cost of one small all-reduce (custom all-reduce / NCCL LL on NVLink).
DEFAULT_ALLREDUCE_LATENCY_S = 8e-6


def _check_fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class RooflineLatency:
    """Step time from FLOPs and bytes of one step of `model` on `tp` x `hardware`."""

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1
    ep: int = 1  # expert parallelism: GPUs of the tp group sharing out whole experts
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    allreduce_latency_s: float = DEFAULT_ALLREDUCE_LATENCY_S
    name: str = "roofline"
    # Per-step constants, derived once so step_time is a handful of float ops.
    _linear_flops_per_token: float = field(init=False, repr=False, compare=False)
    _lm_head_flops_per_seq: float = field(init=False, repr=False, compare=False)
    _attn_flops_per_pair: float = field(init=False, repr=False, compare=False)
    _kv_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _act_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _dense_weight_bytes: float = field(init=False, repr=False, compare=False)
    _expert_bytes: float = field(init=False, repr=False, compare=False)
    _flops_per_s: float = field(init=False, repr=False, compare=False)
    _bytes_per_s: float = field(init=False, repr=False, compare=False)
    _host_link_bytes_per_s: float = field(init=False, repr=False, compare=False)
    _allreduce_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _allreduce_fixed_s: float = field(init=False, repr=False, compare=False)
    _all_to_all_fixed_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m, tp, hw, ep = self.model, self.tp, self.hardware, self.ep
        check_tp(m, tp)
        check_ep(m, tp, ep)
        if not self.step_overhead_s >= 0:
            raise ValueError(f"step_overhead_s must be >= 0, got {self.step_overhead_s!r}")
        if not self.allreduce_latency_s >= 0:
            raise ValueError(f"allreduce_latency_s must be >= 0, "
                             f"got {self.allreduce_latency_s!r}")
        _check_fraction("compute_efficiency", self.compute_efficiency)
        _check_fraction("bandwidth_efficiency", self.bandwidth_efficiency)
        expert = expert_weight_bytes(m, tp, ep) if m.is_moe else 0.0
        dense = weights_read_bytes(m, 1, tp, ep) - experts_touched(m, 1, ep) * expert
        h, act_bytes = m.hidden_size, m.carrier.bytes_per_element
        multi_gpu = tp > 1
        reduces = 2 * m.num_layers - (m.moe_layers if ep > 1 else 0)
        linear_flops = linear_flops_per_token(m, tp)
        # matmuls in fp8/int8/fp4 run at those rates: priced as bf16-equivalent FLOPs
        if any(hw.flops_per_s(kind) != hw.bf16_flops_per_s
               for kind in (m.weights.compute, m.experts.compute)):
            linear_flops = linear_compute_s_per_token(m, hw, tp) * hw.bf16_flops_per_s
        values = {
            "_linear_flops_per_token": linear_flops,
            "_lm_head_flops_per_seq": lm_head_flops_per_seq(m, tp),
            "_attn_flops_per_pair": attention_flops_per_pair(m, tp),
            "_kv_bytes_per_token": kv_bytes_per_token(m, tp),
            # Each layer writes and rereads a few hidden- and intermediate-sized tensors.
            "_act_bytes_per_token": (m.num_layers * activation_elements_per_token(m, tp)
                                     * act_bytes),
            "_dense_weight_bytes": dense,
            "_expert_bytes": expert,
            "_flops_per_s": self.hardware.bf16_flops_per_s * self.compute_efficiency,
            "_bytes_per_s": (self.hardware.memory_bandwidth_bytes_per_s
                             * self.bandwidth_efficiency),
            "_host_link_bytes_per_s": self.hardware.host_link_bandwidth_bytes_per_s,
            # Two all-reduces per layer (after attention and after the MLP).
            # Two all-reduces per layer; under ep the MoE layers' second is an all-to-all.
            "_allreduce_bytes_per_token": (reduces * h * act_bytes if multi_gpu else 0.0),
            "_allreduce_fixed_s": (reduces * self.allreduce_latency_s
                                   if multi_gpu else 0.0),
            "_all_to_all_fixed_s": 2 * m.moe_layers * self.allreduce_latency_s if ep > 1 else 0.0,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def _terms(self, shape: StepShape) -> tuple[float, float, int]:
        """FLOPs, HBM bytes and token rows of one step."""
        prefill_tokens = 0
        pairs = 0.0  # query-key pairs attended, summed over the step
        model = self.model
        decodes = shape.num_decodes
        # sliding-window layers attend to (and read) at most their window per sequence
        decode_context = attended_tokens(model, shape.decode_context_sum, decodes)
        kv_read_tokens = decode_context
        for chunk, context in zip(shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                                  strict=True):
            prefill_tokens += chunk
            seen = attended_tokens(model, context, 1)
            pairs += chunk * seen + chunk * (chunk + 1) * 0.5  # causal within the chunk
            kv_read_tokens += seen
        pairs += decode_context + decodes  # each decode also attends to itself
        seqs = len(shape.prefill_chunk_tokens) + decodes
        padding = max(0, shape.padded_batch - seqs)  # padded slots cost matmuls, not attention
        drafts = shape.num_spec_tokens
        if drafts:  # draft positions: over the context, after the last token and each other
            mean_k = drafts / shape.num_spec_decodes
            pairs += mean_k * shape.spec_context_sum + drafts * (mean_k + 3) * 0.5
        rows = prefill_tokens + decodes + drafts + padding
        if rows == 0:
            return 0.0, 0.0, 0
        flops = (rows * self._linear_flops_per_token + (seqs + padding + drafts)
                 * self._lm_head_flops_per_seq + pairs * self._attn_flops_per_pair)
        touched = experts_touched(model, rows, self.ep) if self._expert_bytes else 0.0
        num_bytes = (self._dense_weight_bytes + touched * self._expert_bytes
                     + (kv_read_tokens + prefill_tokens + decodes + drafts)
                     * self._kv_bytes_per_token
                     + rows * self._act_bytes_per_token)
        return flops, num_bytes, rows

    def _times(self, shape: StepShape) -> tuple[float, float, float, float, float]:
        """Compute, HBM and all-reduce seconds plus the FLOPs and bytes behind them."""
        flops, num_bytes, rows = self._terms(shape)
        if rows == 0:
            return 0.0, 0.0, 0.0, 0.0, 0.0
        allreduce_s = self._allreduce_fixed_s + allreduce_time_s(
            rows * self._allreduce_bytes_per_token, self.tp, self.hardware)
        if self.ep > 1:  # dispatch to the experts' GPUs and combine, per MoE layer
            m = self.model
            allreduce_s += self._all_to_all_fixed_s + m.moe_layers * all_to_all_bytes_per_gpu(
                rows, m.experts_per_token, m.hidden_size, m.carrier.bytes_per_element,
                self.ep) / self.hardware.interconnect_bandwidth_bytes_per_s
        return (flops / self._flops_per_s, num_bytes / self._bytes_per_s, allreduce_s,
                flops, num_bytes)

    def swap_time_s(self, shape: StepShape) -> float:
        """Host-link seconds for the KV the step swaps out and in (one GPU's shard each)."""
        slots = shape.swap_out_tokens + shape.swap_in_tokens
        return slots * self._kv_bytes_per_token / self._host_link_bytes_per_s if slots else 0.0

    def step_time(self, shape: StepShape) -> float:
        """Seconds for one step; an empty shape launches nothing and costs 0 (but swaps)."""
        compute_s, memory_s, allreduce_s, flops, _ = self._times(shape)
        swap_s = self.swap_time_s(shape)
        if flops == 0.0:
            return swap_s
        return max(compute_s, memory_s) + self.step_overhead_s + allreduce_s + swap_s

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Every term of step_time, for capacity reports and tests."""
        compute_s, memory_s, allreduce_s, flops, num_bytes = self._times(shape)
        overhead_s = self.step_overhead_s if flops else 0.0
        swap_s = self.swap_time_s(shape)
        return {
            "compute_s": compute_s,
            "memory_s": memory_s,
            "overhead_s": overhead_s,
            "allreduce_s": allreduce_s,
            "flops": flops,
            "bytes": num_bytes,
            "swap_s": swap_s,
            "total_s": max(compute_s, memory_s) + overhead_s + allreduce_s + swap_s,
        }
