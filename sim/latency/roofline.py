"""Roofline step latency: each kernel's max(compute, HBM) time, plus host and collective costs.

Needs nothing but a ModelSpec and a HardwareSpec, so it is the default when no
calibration table exists. The terms (sim.latency.roofline_terms) price every
layer's GEMMs (a soft maximum of weight-read time and compute by waves of
padded tiles, with a launch each), its small kernels and its attention (one
kernel a layer: the decode kernel when only decodes run, else one prefill-style
kernel over every sequence, as vLLM V1's FlashAttention backend runs a mixed
batch in one varlen call), then
lm_head and sampling once, a CPU overhead per step and per sequence, and the
tensor-parallel all-reduces. Their constants are fitted per GPU family on
published A100 and H100 kernel timings (`python -m calibrate.published.fit_roofline`);
a GPU without data takes its nearest family's fit (roofline_fits.GPU_FAMILIES).
Prefill turns out compute-bound and decode memory-bound because of the shapes,
not because of any special case: a step reads the weights once however many
tokens it computes.

Each GEMM reads its weights in their stored dtype and computes at that dtype's
tensor-core rate (sim.latency.roofline_layers: weights vs experts, MLA's projections,
routers and shared experts); the KV cache is read in kv_dtype, activations move in bf16.
A bf16 dense model is priced exactly as the fit was made. A sliding-window layer attends
to and reads at most its window per sequence; linear/SSM layers' kernels are not priced.
A MoE layer's routed experts are those a step touches (sim.config.moe's closed form, with
routing_skew), in one fused launch per matrix; under expert parallelism (`ep`) each GPU
holds whole experts and a MoE layer's MLP all-reduce becomes an all-to-all (in
`allreduce_s`).

A step's synchronous KV moves (swap preemption's copies, sync offload-tier loads) come
in as `moved_s`, their price on idle links (sim.latency.kv_transfer.step_moves_s), and
are added to the step that carries them: kernels wait for swapped-in or loaded KV, and
a swap-out must finish before its blocks are overwritten.

A speculative verify (StepShape.num_spec_tokens > 0) runs the target over
1 + k_i positions of each drafting sequence: k_i more matmul rows, logits and
KV writes each, and the drafts' attention over the cached context plus the
causal pairs among the new positions (k taken as the step's mean k_i). The
KV is read once per sequence however many positions verify, which is why a
memory-bound decode verifies drafts almost for free. The draft's own passes
are priced by sim.latency.draft.SpeculativeLatency around this model.

This module builds the model from the specs and adds a step's parts up; the parts of
one step's shape are priced in sim.latency.roofline_parts, a decode run's steps in
bulk in sim.latency.roofline_runs (RooflineLatency inherits both).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sim.config.attention import layer_bytes_per_token, layer_counts
from sim.config.costs import attention_flops_per_pair
from sim.config.hardware import HardwareSpec
from sim.config.link import Link
from sim.config.specs import ModelSpec, check_ep, check_tp
from sim.core.plan import StepShape
from sim.latency.roofline_fits import RooflineParams, params_for
from sim.latency.roofline_layers import Gemm, layer_groups, model_dims
from sim.latency.roofline_parts import PricedGroup
from sim.latency.roofline_runs import RooflineRuns
from sim.latency.roofline_terms import (
    AttentionCost,
    GemmCost,
    LayerDims,
    attention_costs,
    cpu_overhead_s,
    gemm_cost,
    sampling_s,
    visible_host_s,
)

__all__ = ["PARTS", "RooflineLatency", "model_dims"]

# What step_time adds up (breakdown's keys, besides total_s; a step's KV moves come in
# as step_time's moved_s).
PARTS = ("gemm_s", "small_s", "attention_s", "lm_head_s", "overhead_s", "allreduce_s")


def _check_fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class RooflineLatency(RooflineRuns):
    """Step time of one step of `model` on `tp` x `hardware`, from the kernels' FLOPs and bytes.

    `params` default to the hardware's family fit; `step_overhead_s`,
    `seq_overhead_s`, `compute_efficiency` and `bandwidth_efficiency` override
    single constants of it (None: the fit's). `ep`: GPUs of the tp group
    sharing out whole experts (MoE only).
    """

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1
    ep: int = 1
    step_overhead_s: float | None = None
    compute_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    allreduce_latency_s: float | None = None  # one collective's fixed cost; None: the link's
    seq_overhead_s: float | None = None
    params: RooflineParams | None = None
    name: str = "roofline"
    # async scheduling: the share of host time still serial with the GPU (1: synchronous,
    # the engine as vLLM runs it without async scheduling); see visible_host_s
    host_serial_share: float = 1.0
    # data-parallel attention ranks sharing the experts (ep = dp x tp): > 1 prices one rank,
    # its routed experts and their all-to-alls left to the lockstep group
    # (sim.latency.moe_dp_ep.DPEPGroupLatency)
    dp: int = 1
    _p: RooflineParams = field(init=False, repr=False, compare=False)
    _dims: LayerDims = field(init=False, repr=False, compare=False)
    _groups: tuple[PricedGroup, ...] = field(init=False, repr=False, compare=False)
    _lm_head: GemmCost = field(init=False, repr=False, compare=False)
    _decode_attention: AttentionCost = field(init=False, repr=False, compare=False)
    _prefill_attention: AttentionCost = field(init=False, repr=False, compare=False)
    _act_bytes: float = field(init=False, repr=False, compare=False)
    _attn_layers: int = field(init=False, repr=False, compare=False)
    _sliding_share: float = field(init=False, repr=False, compare=False)
    _attn_flops_per_pair: float = field(init=False, repr=False, compare=False)
    _kv_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _flops_per_s: float = field(init=False, repr=False, compare=False)
    _bytes_per_s: float = field(init=False, repr=False, compare=False)
    _link: Link = field(init=False, repr=False, compare=False)  # hardware.link, maybe re-timed
    _allreduces: int = field(init=False, repr=False, compare=False)  # all-reduces a step
    _allreduce_bytes_per_token: float = field(init=False, repr=False, compare=False)  # each
    # rows -> _fixed_parts' GEMMs, small kernels and collectives: steps repeat these row
    # counts by the thousand (a decode step's rows are its batch, a prefill's its prompt
    # plus the decodes beside it), and the GEMMs' tile-and-wave pricing is most of a step's
    # price; the memo holds the very floats computed the first time
    _memo: dict[float, tuple[float, float, float]] = field(init=False, repr=False,
                                                            compare=False)
    # (sequences, logit rows) -> _fixed_parts' lm_head and sampling, CPU: apart from the
    # rows, which vary with every prompt while a step's sequences take a few values
    _seqs_memo: dict[tuple[float, float], tuple[float, float]] = field(
        init=False, repr=False, compare=False)
    # (decodes, padded batch) of a plain-decode step -> its parts but attention, as step_time
    # adds them: (0 + gemms + small, lm_head, cpu, collectives); a run's steps and most
    # ordinary steps are plain decodes, priced from this and the attention law alone
    _decode_memo: dict[tuple[int, int], tuple[float, float, float, float]] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m, tp, ep, hw = self.model, self.tp, self.ep, self.hardware
        check_tp(m, tp)
        check_ep(m, tp, ep, self.dp)
        for name in ("step_overhead_s", "seq_overhead_s"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not 0 <= self.host_serial_share <= 1:
            raise ValueError(f"host_serial_share must be in [0, 1], "
                             f"got {self.host_serial_share!r}")
        if self.allreduce_latency_s is not None and not (
                0 <= self.allreduce_latency_s < float("inf")):
            raise ValueError(f"allreduce_latency_s must be finite and >= 0 (None: the GPU "
                             f"link's), got {self.allreduce_latency_s!r}")
        for name in ("compute_efficiency", "bandwidth_efficiency"):
            if getattr(self, name) is not None:
                _check_fraction(name, getattr(self, name))
        overrides = {k: v for k, v in (("cpu_step_s", self.step_overhead_s),
                                       ("cpu_seq_s", self.seq_overhead_s),
                                       ("compute_efficiency", self.compute_efficiency),
                                       ("bandwidth_efficiency", self.bandwidth_efficiency))
                     if v is not None}
        params = dataclasses.replace(self.params or params_for(hw.name, hw.sm_count), **overrides)
        dims = model_dims(m, tp)
        act = m.carrier.bytes_per_element
        bw = hw.memory_bandwidth_bytes_per_s

        def cost(g: Gemm) -> GemmCost:
            return gemm_cost(g.k, g.n, g.flops_per_s, bw, params, g.weight_bytes, act,
                             g.tile_scale)

        counts = layer_counts(m)
        attn_layers = counts["full"] + counts["sliding"]
        multi_gpu = tp > 1
        # Two all-reduces per layer (after attention and after the MLP); under ep a MoE
        # layer's second is an all-to-all instead.
        reduces = 2 * m.num_layers - (m.moe_layers if ep > 1 else 0)
        attn_flops_per_pair = attention_flops_per_pair(m, tp) / attn_layers  # one layer
        kv_bytes = layer_bytes_per_token(m, tp)  # one attending layer
        decode_attention, prefill_attention = attention_costs(
            attn_flops_per_pair, kv_bytes, hw.bf16_flops_per_s, bw, params)
        values = {
            "_p": params,
            "_dims": dims,
            "_groups": tuple(PricedGroup(g, tuple(map(cost, g.dense)),
                                          tuple(map(cost, g.experts)))
                             for g in layer_groups(m, hw, tp, ep, routed=self.dp == 1)),
            "_lm_head": gemm_cost(dims.hidden, dims.vocab, hw.bf16_flops_per_s, bw, params,
                                  act, act),
            "_act_bytes": act,
            "_attn_layers": attn_layers,
            "_sliding_share": counts["sliding"] / attn_layers,
            "_decode_attention": decode_attention,
            "_prefill_attention": prefill_attention,
            "_attn_flops_per_pair": attn_flops_per_pair,
            "_kv_bytes_per_token": kv_bytes,
            "_flops_per_s": hw.bf16_flops_per_s,
            "_bytes_per_s": bw,
            "_link": (hw.link if self.allreduce_latency_s is None else
                      dataclasses.replace(hw.link, latency_s=self.allreduce_latency_s)),
            "_allreduces": reduces if multi_gpu else 0,
            "_allreduce_bytes_per_token": m.hidden_size * act if multi_gpu else 0.0,
            "_memo": {},
            "_seqs_memo": {},
            "_decode_memo": {},
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @property
    def fitted(self) -> RooflineParams:
        """The constants in use: the family's fit with this model's overrides."""
        return self._p


    def sampling_s(self, seqs: float) -> float:
        """Sampling's logit traffic for `seqs` sequences (part of lm_head_s)."""
        return sampling_s(self._dims, seqs, self._bytes_per_s, self._p)

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        """Seconds for one step; an empty shape launches nothing and costs 0 (but its moves).

        `moved_s`: the step's synchronous KV moves (swaps, sync tier loads) on idle links
        (sim.latency.kv_transfer.step_moves_s): copies on the GPU's stream, so under async
        scheduling they hide host work as kernels do.
        A plain-decode step (most steps) is the general sum with its context-free parts
        remembered (_decode_parts) and attention's law inlined, operation for operation."""
        n = shape.num_decodes
        if n and not (shape.prefill_chunk_tokens or shape.num_spec_tokens or moved_s
                      or self._sliding_share):
            head, lm_head_s, cpu_s, collectives_s = self._decode_parts(shape)
            cost = self._decode_attention
            pairs = 0.0 + (shape.decode_context_sum + n)
            compute = pairs * cost.pair_s
            memory = float(shape.decode_context_sum + n) * cost.token_s
            t = cost.launch_s + (compute if compute >= memory else memory)
            attention = self._attn_layers * (t if t >= cost.min_s else cost.min_s)
            if self.host_serial_share < 1.0:
                gpu_s = head + attention + lm_head_s + collectives_s
                return gpu_s + visible_host_s(cpu_s, gpu_s, self.host_serial_share)
            return head + attention + lm_head_s + cpu_s + collectives_s + 0.0
        parts = self._parts(shape)
        if self.host_serial_share < 1.0 and parts:
            gpu_s = sum(parts) - parts[4] + moved_s
            return gpu_s + visible_host_s(parts[4], gpu_s, self.host_serial_share)
        return sum(parts) + moved_s

    def output_lag_s(self, shape: StepShape) -> float:
        """How long after the step's GPU time its tokens leave the engine: under async
        scheduling the overlapped host work (output processing among it) runs while the
        next step does, so it delays the tokens without lengthening the step; synchronous,
        it is inside the step (0)."""
        if self.host_serial_share >= 1.0:
            return 0.0
        return (1.0 - self.host_serial_share) * cpu_overhead_s(self._counts(shape)[3], self._p)


    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Every term of step_time (and the kernels' ideal compute and HBM time)."""
        parts = dict.fromkeys((*PARTS, "flops", "bytes", "compute_s", "memory_s"), 0.0)
        parts.update(zip(PARTS, self._parts(shape), strict=False))
        rows, decode, prefill, _, logit_rows = self._counts(shape)
        if rows:
            parts.update(self._work(rows, decode[0] + prefill[0], decode[1] + prefill[1],
                                    logit_rows))
        parts["total_s"] = self.step_time(shape)
        return parts
