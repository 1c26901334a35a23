"""Roofline step latency: each kernel's max(compute, HBM) time, plus host and collective costs.

Needs nothing but a ModelSpec and a HardwareSpec, so it is the default when no
calibration table exists. The terms (sim.latency.roofline_terms) price every
layer's four GEMMs (a soft maximum of weight-read and compute time, with a
launch each and a tile's worth of rows), its small kernels and its attention,
then lm_head and sampling once, a CPU overhead per step and per sequence, and
the tensor-parallel all-reduces. Their constants are fitted per GPU family on
published A100 and H100 kernel timings (`python -m calibrate.fit_roofline`);
a GPU without data takes its nearest family's fit (roofline_terms.GPU_FAMILIES).
Prefill turns out compute-bound and decode memory-bound because of the shapes,
not because of any special case: a step reads the weights once however many
tokens it computes.

Swap preemption's KV transfers (StepShape.swap_*_tokens) go over the host link
and are added to the step that carries them: kernels wait for swapped-in KV,
and a swap-out must finish before its blocks are overwritten.

A speculative verify (StepShape.num_spec_tokens > 0) runs the target over
1 + k_i positions of each drafting sequence: k_i more matmul rows, logits and
KV writes each, and the drafts' attention over the cached context plus the
causal pairs among the new positions (k taken as the step's mean k_i). The
KV is read once per sequence however many positions verify, which is why a
memory-bound decode verifies drafts almost for free. The draft's own passes
are priced by sim.latency.draft.SpeculativeLatency around this model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from sim.config.costs import allreduce_time_s
from sim.config.specs import HardwareSpec, ModelSpec, check_tp, kv_heads_per_gpu
from sim.core.plan import StepShape
from sim.latency.roofline_terms import (
    GemmCost,
    LayerDims,
    RooflineParams,
    attention_s,
    cpu_overhead_s,
    gemm_cost,
    params_for,
    sampling_s,
    small_kernels_s,
)

# What step_time adds up (breakdown's keys, besides swap_s and total_s).
PARTS = ("gemm_s", "small_s", "attention_s", "lm_head_s", "overhead_s", "allreduce_s")
# Fixed cost of one small all-reduce (custom all-reduce / NCCL LL on NVLink).
DEFAULT_ALLREDUCE_LATENCY_S = 8e-6


def _check_fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")


def model_dims(model: ModelSpec, tp: int) -> LayerDims:
    """One GPU's kernel widths; an MoE layer's MLP is one expert's (priced per expert)."""
    return LayerDims(model.num_layers, model.hidden_size, model.num_heads * model.head_dim // tp,
                     kv_heads_per_gpu(model, tp) * model.head_dim,
                     model.intermediate_size / tp, 2, model.vocab_size / tp)


@dataclass(frozen=True, slots=True)
class RooflineLatency:
    """Step time of one step of `model` on `tp` x `hardware`, from the kernels' FLOPs and bytes.

    `params` default to the hardware's family fit; `step_overhead_s`,
    `seq_overhead_s`, `compute_efficiency` and `bandwidth_efficiency` override
    single constants of it (None: the fit's).
    """

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1
    dtype_bytes: float = 2
    step_overhead_s: float | None = None
    compute_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    allreduce_latency_s: float = DEFAULT_ALLREDUCE_LATENCY_S
    seq_overhead_s: float | None = None
    params: RooflineParams | None = None
    name: str = "roofline"
    _p: RooflineParams = field(init=False, repr=False, compare=False)
    _dims: LayerDims = field(init=False, repr=False, compare=False)
    _gemms: tuple[GemmCost, ...] = field(init=False, repr=False, compare=False)
    _attn_flops_per_pair: float = field(init=False, repr=False, compare=False)
    _kv_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _flops_per_s: float = field(init=False, repr=False, compare=False)
    _bytes_per_s: float = field(init=False, repr=False, compare=False)
    _allreduce_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _allreduce_fixed_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m, tp, dtype = self.model, self.tp, self.dtype_bytes
        check_tp(m, tp)
        if not dtype > 0:
            raise ValueError(f"dtype_bytes must be positive, got {dtype!r}")
        for name in ("step_overhead_s", "seq_overhead_s"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not self.allreduce_latency_s >= 0:
            raise ValueError(f"allreduce_latency_s must be >= 0, "
                             f"got {self.allreduce_latency_s!r}")
        for name in ("compute_efficiency", "bandwidth_efficiency"):
            if getattr(self, name) is not None:
                _check_fraction(name, getattr(self, name))
        overrides = {k: v for k, v in (("cpu_step_s", self.step_overhead_s),
                                       ("cpu_seq_s", self.seq_overhead_s),
                                       ("compute_efficiency", self.compute_efficiency),
                                       ("bandwidth_efficiency", self.bandwidth_efficiency))
                     if v is not None}
        params = dataclasses.replace(self.params or params_for(self.hardware.name), **overrides)
        dims = model_dims(m, tp)
        kv_dim = kv_heads_per_gpu(m, tp) * m.head_dim
        multi_gpu = tp > 1
        values = {
            "_p": params,
            "_dims": dims,
            # q/k/v, output, gate+up, down, lm_head
            "_gemms": tuple(gemm_cost(k, n, self.hardware.bf16_flops_per_s,
                                      self.hardware.memory_bandwidth_bytes_per_s, params, dtype)
                            for k, n in (*dims.gemms, (dims.hidden, dims.vocab))),
            "_attn_flops_per_pair": 4 * m.num_heads / tp * m.head_dim,  # one layer
            "_kv_bytes_per_token": 2 * kv_dim * dtype,  # one layer
            "_flops_per_s": self.hardware.bf16_flops_per_s,
            "_bytes_per_s": self.hardware.memory_bandwidth_bytes_per_s,
            # Two all-reduces per layer (after attention and after the MLP).
            "_allreduce_bytes_per_token": (2 * m.num_layers * m.hidden_size * dtype
                                           if multi_gpu else 0.0),
            "_allreduce_fixed_s": (2 * m.num_layers * self.allreduce_latency_s
                                   if multi_gpu else 0.0),
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @property
    def fitted(self) -> RooflineParams:
        """The constants in use: the family's fit with this model's overrides."""
        return self._p

    def _counts(self, shape: StepShape) -> tuple[float, float, float, float, float]:
        """Token rows, query-key pairs, KV tokens touched, sequences, logit rows."""
        prefill_tokens = 0
        pairs = 0.0  # query-key pairs attended, summed over the step
        kv_read_tokens = shape.decode_context_sum
        for chunk, context in zip(shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                                  strict=True):
            prefill_tokens += chunk
            pairs += chunk * context + chunk * (chunk + 1) * 0.5  # causal within the chunk
            kv_read_tokens += context
        decodes = shape.num_decodes
        pairs += shape.decode_context_sum + decodes  # each decode also attends to itself
        seqs = len(shape.prefill_chunk_tokens) + decodes
        padding = max(0, shape.padded_batch - seqs)  # padded slots cost matmuls, not attention
        drafts = shape.num_spec_tokens
        if drafts:  # draft positions: over the context, after the last token and each other
            mean_k = drafts / shape.num_spec_decodes
            pairs += mean_k * shape.spec_context_sum + drafts * (mean_k + 3) * 0.5
        rows = prefill_tokens + decodes + drafts + padding
        kv_tokens = kv_read_tokens + prefill_tokens + decodes + drafts
        return float(rows), pairs, float(kv_tokens), float(seqs), float(seqs + padding + drafts)

    def _layer_gemms_s(self, rows: float) -> float:
        """Attention projections, then the MLP: dense, or each touched expert over its rows."""
        qkv, out, up, down, _ = self._gemms
        m = self.model
        if not m.is_moe:
            return qkv.seconds(rows) + out.seconds(rows) + up.seconds(rows) + down.seconds(rows)
        touched = min(m.num_experts, rows * m.experts_per_token)
        per_expert = rows * m.experts_per_token / touched
        return (qkv.seconds(rows) + out.seconds(rows)
                + touched * (up.seconds(per_expert) + down.seconds(per_expert)))

    def _parts(self, shape: StepShape) -> tuple[float, ...]:
        """Every priced part of one step in PARTS' order, seconds (empty: nothing runs)."""
        rows, pairs, kv_tokens, seqs, logit_rows = self._counts(shape)
        if rows == 0:
            return ()
        p, dims, b = self._p, self._dims, self._bytes_per_s
        layers = self.model.num_layers
        attention = layers * attention_s(
            pairs * self._attn_flops_per_pair, kv_tokens * self._kv_bytes_per_token,
            self._flops_per_s, b, p) if pairs else 0.0
        return (layers * self._layer_gemms_s(rows),
                # the activation runs per expert row
                layers * small_kernels_s(dims, rows * self.model.experts_per_token, b, p,
                                         self.dtype_bytes),
                attention,
                self._gemms[4].seconds(logit_rows) + sampling_s(dims, logit_rows, b, p),
                cpu_overhead_s(seqs, p),
                self._allreduce_fixed_s + allreduce_time_s(
                    rows * self._allreduce_bytes_per_token, self.tp, self.hardware)
                if self.tp > 1 else 0.0)

    def _work(self, rows: float, pair_flops: float, kv_bytes: float, logit_rows: float
              ) -> dict[str, float]:
        """FLOPs and HBM bytes of the step's kernels, and their ideal times: the regimes."""
        m, d, p, dtype = self.model, self._dims, self._p, self.dtype_bytes
        qkv, out, up, down = d.gemms
        attn_kn = qkv[0] * qkv[1] + out[0] * out[1]
        mlp_kn = up[0] * up[1] + down[0] * down[1]
        touched = min(m.num_experts, rows * m.experts_per_token)
        flops = (m.num_layers * (2 * rows * (attn_kn + m.experts_per_token * mlp_kn) + pair_flops)
                 + 2 * logit_rows * d.hidden * d.vocab)
        weights = m.num_layers * (attn_kn + touched * mlp_kn) + d.hidden * d.vocab
        acts = m.num_layers * rows * m.experts_per_token * d.small_bytes_per_row
        num_bytes = (weights + acts) * dtype + m.num_layers * kv_bytes
        return {"flops": flops, "bytes": num_bytes,
                "compute_s": flops / (self._flops_per_s * p.compute_efficiency),
                "memory_s": num_bytes / (self._bytes_per_s * p.bandwidth_efficiency)}

    def sampling_s(self, seqs: float) -> float:
        """Sampling's logit traffic for `seqs` sequences (part of lm_head_s)."""
        return sampling_s(self._dims, seqs, self._bytes_per_s, self._p)

    def swap_time_s(self, shape: StepShape) -> float:
        """Host-link seconds for the KV the step swaps out and in (one GPU's shard each)."""
        slots = shape.swap_out_tokens + shape.swap_in_tokens
        return (slots * self.model.num_layers * self._kv_bytes_per_token
                / self.hardware.host_link_bandwidth_bytes_per_s) if slots else 0.0

    def step_time(self, shape: StepShape) -> float:
        """Seconds for one step; an empty shape launches nothing and costs 0 (but swaps)."""
        swapped = shape.swap_out_tokens + shape.swap_in_tokens
        return sum(self._parts(shape)) + (self.swap_time_s(shape) if swapped else 0.0)

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        """step_time of each step of a decode run (sim.core.decode_run): only attention
        grows with the contexts, so the other parts are priced once and each step's sum is
        step_time's, part for part in the same order (plain floats: numpy's power could
        round differently)."""
        parts = self._parts(shape)
        if not parts:
            return np.zeros(steps)
        gemms_s, small_s, _, lm_head_s, cpu_s, allreduce_s = parts
        n, layers, p = shape.num_decodes, self.model.num_layers, self._p
        pair_flops, kv_bytes = self._attn_flops_per_pair, self._kv_bytes_per_token
        flops_per_s, bytes_per_s = self._flops_per_s, self._bytes_per_s
        out = []
        for s in range(steps):
            tokens = shape.decode_context_sum + s * n + n  # = pairs = KV tokens, decodes only
            pairs = 0.0 + tokens
            attention = layers * attention_s(pairs * pair_flops, float(tokens) * kv_bytes,
                                             flops_per_s, bytes_per_s, p) if pairs else 0.0
            out.append(sum((gemms_s, small_s, attention, lm_head_s, cpu_s, allreduce_s)) + 0.0)
        return np.array(out)

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Every term of step_time (and the kernels' ideal compute and HBM time)."""
        parts = dict.fromkeys((*PARTS, "flops", "bytes", "compute_s", "memory_s"), 0.0)
        parts.update(zip(PARTS, self._parts(shape), strict=False))
        rows, pairs, kv_tokens, _, logit_rows = self._counts(shape)
        if rows:
            parts.update(self._work(rows, pairs * self._attn_flops_per_pair,
                                    kv_tokens * self._kv_bytes_per_token, logit_rows))
        parts["swap_s"] = self.swap_time_s(shape)
        parts["total_s"] = self.step_time(shape)
        return parts
