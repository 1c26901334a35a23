"""Roofline step latency: each kernel's max(compute, HBM) time, plus host and collective costs.

Needs nothing but a ModelSpec and a HardwareSpec, so it is the default when no
calibration table exists. The terms (sim.latency.roofline_terms) price every
layer's GEMMs (a soft maximum of weight-read time and compute by waves of
padded tiles, with a launch each), its small kernels and its attention (a
decode kernel and a prefill kernel, each where the step has them), then
lm_head and sampling once, a CPU overhead per step and per sequence, and the
tensor-parallel all-reduces. Their constants are fitted per GPU family on
published A100 and H100 kernel timings (`python -m calibrate.fit_roofline`);
a GPU without data takes its nearest family's fit (roofline_terms.GPU_FAMILIES).
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

from sim.config.attention import attended_tokens, layer_bytes_per_token, layer_counts
from sim.config.costs import (
    allreduce_time_s,
    attention_flops_per_pair,
    experts_touched,
    kv_bytes_per_token,
)
from sim.config.moe import all_to_all_bytes_per_gpu
from sim.config.specs import HardwareSpec, ModelSpec, check_ep, check_tp
from sim.core.plan import StepShape
from sim.latency.roofline_layers import Gemm, LayerGroup, layer_groups, model_dims
from sim.latency.roofline_terms import (
    AttentionCost,
    GemmCost,
    LayerDims,
    RooflineParams,
    attention_costs,
    cpu_overhead_s,
    gemm_cost,
    params_for,
    sampling_s,
    small_kernels_s,
)

__all__ = ["PARTS", "RooflineLatency", "model_dims"]

# What step_time adds up (breakdown's keys, besides swap_s and total_s).
PARTS = ("gemm_s", "small_s", "attention_s", "lm_head_s", "overhead_s", "allreduce_s")
# Fixed cost of one small all-reduce (custom all-reduce / NCCL LL on NVLink).
DEFAULT_ALLREDUCE_LATENCY_S = 8e-6
# Row counts whose context-free parts a model remembers (see RooflineLatency._fixed_parts);
# past it the memo starts again, so memory stays bounded by the budget's row counts.
MEMO_SHAPES = 4096
# A run this long or longer is priced in numpy; shorter in plain floats (same floats):
# about where numpy's ~1 us per operation costs what a plain step's ~0.2 us does.
NUMPY_RUN_STEPS = 32


def _check_fraction(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class _PricedGroup:
    """A LayerGroup with its GEMMs' fitted costs, derived once."""

    group: LayerGroup
    dense: tuple[GemmCost, ...]
    experts: tuple[GemmCost, ...]


@dataclass(frozen=True, slots=True)
class RooflineLatency:
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
    allreduce_latency_s: float = DEFAULT_ALLREDUCE_LATENCY_S
    seq_overhead_s: float | None = None
    params: RooflineParams | None = None
    name: str = "roofline"
    _p: RooflineParams = field(init=False, repr=False, compare=False)
    _dims: LayerDims = field(init=False, repr=False, compare=False)
    _groups: tuple[_PricedGroup, ...] = field(init=False, repr=False, compare=False)
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
    _allreduce_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _allreduce_fixed_s: float = field(init=False, repr=False, compare=False)
    _all_to_all_fixed_s: float = field(init=False, repr=False, compare=False)
    # (rows, sequences, logit rows) -> _fixed_parts: steps repeat these shapes by the
    # thousand (a decode step's rows are its batch), and the GEMMs' tile-and-wave pricing
    # is most of a step's price; the memo holds the very floats computed the first time
    _memo: dict[tuple[float, float, float], tuple[float, float, float, float, float]] = field(
        init=False, repr=False, compare=False)
    # (decodes, padded batch) of a plain-decode step -> its parts but attention, as step_time
    # adds them: (0 + gemms + small, lm_head, cpu, collectives); a run's steps and most
    # ordinary steps are plain decodes, priced from this and the attention law alone
    _decode_memo: dict[tuple[int, int], tuple[float, float, float, float]] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m, tp, ep, hw = self.model, self.tp, self.ep, self.hardware
        check_tp(m, tp)
        check_ep(m, tp, ep)
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
            "_groups": tuple(_PricedGroup(g, tuple(map(cost, g.dense)),
                                          tuple(map(cost, g.experts)))
                             for g in layer_groups(m, hw, tp, ep)),
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
            "_allreduce_bytes_per_token": reduces * m.hidden_size * act if multi_gpu else 0.0,
            "_allreduce_fixed_s": reduces * self.allreduce_latency_s if multi_gpu else 0.0,
            "_all_to_all_fixed_s": (2 * m.moe_layers * self.allreduce_latency_s
                                    if ep > 1 else 0.0),
            "_memo": {},
            "_decode_memo": {},
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @property
    def fitted(self) -> RooflineParams:
        """The constants in use: the family's fit with this model's overrides."""
        return self._p

    def _attended(self, context_tokens: int, sequences: int) -> float:
        """Context the average attending layer sees: sliding layers at most their window
        per sequence (sim.config.attention.attended_tokens)."""
        if not self._sliding_share:
            return context_tokens
        return attended_tokens(self.model, context_tokens, sequences)

    def _counts(self, shape: StepShape) -> tuple[float, tuple[float, float],
                                                 tuple[float, float], float, float]:
        """Token rows; (query-key pairs, KV tokens touched) per attending layer of the
        decodes' kernel and of the prefill chunks' kernel; sequences; logit rows."""
        decodes = shape.num_decodes
        if not shape.prefill_chunk_tokens and not shape.num_spec_tokens:
            # plain decodes (most steps): the general path below with nothing to add
            decode_context = self._attended(shape.decode_context_sum, decodes)
            padding = max(0, shape.padded_batch - decodes)
            return (float(decodes + padding), (0.0 + (decode_context + decodes),
                                               float(decode_context + decodes)),
                    (0.0, 0.0), float(decodes), float(decodes + padding))
        prefill_tokens = 0
        prefill_pairs = prefill_kv = 0.0
        decode_context = self._attended(shape.decode_context_sum, decodes)
        for chunk, context in zip(shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                                  strict=True):
            prefill_tokens += chunk
            seen = self._attended(context, 1)
            prefill_pairs += chunk * seen + chunk * (chunk + 1) * 0.5  # causal in the chunk
            prefill_kv += seen + chunk
        decode_pairs = 0.0
        decode_pairs += decode_context + decodes  # each decode also attends to itself
        seqs = len(shape.prefill_chunk_tokens) + decodes
        padding = max(0, shape.padded_batch - seqs)  # padded slots cost matmuls, not attention
        drafts = shape.num_spec_tokens
        if drafts:  # draft positions: over the context, after the last token and each other
            mean_k = drafts / shape.num_spec_decodes
            decode_pairs += (mean_k * self._attended(shape.spec_context_sum,
                                                     shape.num_spec_decodes)
                             + drafts * (mean_k + 3) * 0.5)
        rows = prefill_tokens + decodes + drafts + padding
        decode_kv = float(decode_context + decodes + drafts)
        return (float(rows), (decode_pairs, decode_kv), (prefill_pairs, prefill_kv),
                float(seqs), float(seqs + padding + drafts))

    def _experts(self, rows: float) -> tuple[float, float]:
        """Routed experts a MoE layer touches on the busiest GPU, and each one's rows."""
        m = self.model
        touched = experts_touched(m, rows, self.ep)
        return touched, rows * m.experts_per_token / (self.ep * touched)

    def _gemms_s(self, rows: float) -> float:
        """Every layer's GEMMs: those over all rows, then each touched expert over its rows.

        A layer's routed experts run as one fused kernel per matrix (vLLM's fused_moe):
        each touched expert adds its weight read and its tiles, the launch is paid once.
        """
        total = touched = per_expert = 0.0
        if self.model.is_moe:
            touched, per_expert = self._experts(rows)
        for g in self._groups:
            layer = 0.0
            for c in g.dense:
                layer += c.seconds(rows)
            for c in g.experts:
                layer += c.launch_s + touched * (c.seconds(per_expert) - c.launch_s)
            total += g.group.layers * layer
        return total

    def _collectives_s(self, rows: float) -> float:
        """Tensor parallelism's all-reduces; under ep each MoE layer's all-to-all."""
        if self.tp == 1:
            return 0.0
        seconds = self._allreduce_fixed_s + allreduce_time_s(
            rows * self._allreduce_bytes_per_token, self.tp, self.hardware)
        if self.ep > 1:  # dispatch to the experts' GPUs and combine, per MoE layer
            m = self.model
            seconds += self._all_to_all_fixed_s + m.moe_layers * all_to_all_bytes_per_gpu(
                rows, m.experts_per_token, m.hidden_size, self._act_bytes,
                self.ep) / self.hardware.interconnect_bandwidth_bytes_per_s
        return seconds

    def _attention_s(self, decode: tuple[float, float], prefill: tuple[float, float]
                     ) -> float:
        """Every attending layer's decode kernel and prefill kernel (each where it runs)."""
        seconds = self._decode_attention.seconds(*decode) if decode[0] else 0.0
        if prefill[0]:
            seconds += self._prefill_attention.seconds(*prefill)
        return self._attn_layers * seconds

    def _parts(self, shape: StepShape) -> tuple[float, ...]:
        """Every priced part of one step in PARTS' order, seconds (empty: nothing runs)."""
        rows, decode, prefill, seqs, logit_rows = self._counts(shape)
        if rows == 0:
            return ()
        gemms_s, small_s, lm_head_s, cpu_s, collectives_s = self._fixed_parts(
            rows, seqs, logit_rows)
        return (gemms_s, small_s, self._attention_s(decode, prefill), lm_head_s, cpu_s,
                collectives_s)

    def _fixed_parts(self, rows: float, seqs: float, logit_rows: float
                     ) -> tuple[float, float, float, float, float]:
        """The parts that do not depend on the contexts (all but attention), remembered."""
        key = (rows, seqs, logit_rows)
        memo = self._memo
        parts = memo.get(key)
        if parts is None:
            p, dims, b = self._p, self._dims, self._bytes_per_s
            small = 0.0
            for g in self._groups:
                small += g.group.layers * small_kernels_s(g.group.dims, rows, b, p,
                                                          self._act_bytes)
            parts = (self._gemms_s(rows), small,
                     self._lm_head.seconds(logit_rows) + sampling_s(dims, logit_rows, b, p),
                     cpu_overhead_s(seqs, p), self._collectives_s(rows))
            if len(memo) >= MEMO_SHAPES:
                memo.clear()
            memo[key] = parts
        return parts

    def _decode_parts(self, shape: StepShape) -> tuple[float, float, float, float]:
        """A plain-decode step's parts but attention (sum()'s first two added), remembered
        by batch size and padding: all it depends on."""
        key = (shape.num_decodes, shape.padded_batch)
        parts = self._decode_memo.get(key)
        if parts is None:
            gemms_s, small_s, _, lm_head_s, cpu_s, collectives_s = self._parts(shape)
            parts = (0 + gemms_s + small_s, lm_head_s, cpu_s, collectives_s)
            if len(self._decode_memo) >= MEMO_SHAPES:
                self._decode_memo.clear()
            self._decode_memo[key] = parts
        return parts

    def _work(self, rows: float, pairs: float, kv_tokens: float, logit_rows: float
              ) -> dict[str, float]:
        """FLOPs and HBM bytes of the step's kernels, and their ideal times: the regimes."""
        p, d, act = self._p, self._dims, self._act_bytes
        touched, per_expert = self._experts(rows) if self.model.is_moe else (0.0, 0.0)
        bandwidth = self._bytes_per_s * p.bandwidth_efficiency
        flops = compute_s = num_bytes = 0.0
        for g in self._groups:
            for gemms, count, gemm_rows in ((g.group.dense, 1.0, rows),
                                            (g.group.experts, touched, per_expert)):
                for gemm in gemms:
                    work = g.group.layers * count * 2 * gemm_rows * gemm.k * gemm.n
                    flops += work
                    compute_s += work / (gemm.flops_per_s * p.compute_efficiency)
                    num_bytes += g.group.layers * count * gemm.k * gemm.n * gemm.weight_bytes
            num_bytes += g.group.layers * rows * g.group.dims.small_bytes_per_row * act
        other = (self._attn_layers * pairs * self._attn_flops_per_pair
                 + 2 * logit_rows * d.hidden * d.vocab)
        flops += other
        compute_s += other / (self._flops_per_s * p.compute_efficiency)
        num_bytes += (d.hidden * d.vocab * act
                      + self._attn_layers * kv_tokens * self._kv_bytes_per_token)
        return {"flops": flops, "bytes": num_bytes, "compute_s": compute_s,
                "memory_s": num_bytes / bandwidth}

    def sampling_s(self, seqs: float) -> float:
        """Sampling's logit traffic for `seqs` sequences (part of lm_head_s)."""
        return sampling_s(self._dims, seqs, self._bytes_per_s, self._p)

    def swap_time_s(self, shape: StepShape) -> float:
        """Host-link seconds for the KV the step swaps out and in (one GPU's shard each)."""
        slots = shape.swap_out_tokens + shape.swap_in_tokens
        return (slots * kv_bytes_per_token(self.model, self.tp)
                / self.hardware.host_link_bandwidth_bytes_per_s) if slots else 0.0

    def step_time(self, shape: StepShape) -> float:
        """Seconds for one step; an empty shape launches nothing and costs 0 (but swaps).

        A plain-decode step (most steps) is the general sum with its context-free parts
        remembered (_decode_parts) and attention's law inlined, operation for operation."""
        swapped = shape.swap_out_tokens + shape.swap_in_tokens
        n = shape.num_decodes
        if n and not (shape.prefill_chunk_tokens or shape.num_spec_tokens or swapped
                      or self._sliding_share):
            head, lm_head_s, cpu_s, collectives_s = self._decode_parts(shape)
            cost = self._decode_attention
            pairs = 0.0 + (shape.decode_context_sum + n)
            compute = pairs * cost.pair_s
            memory = float(shape.decode_context_sum + n) * cost.token_s
            t = cost.launch_s + (compute if compute >= memory else memory)
            attention = self._attn_layers * (t if t >= cost.min_s else cost.min_s)
            return head + attention + lm_head_s + cpu_s + collectives_s + 0.0
        return sum(self._parts(shape)) + (self.swap_time_s(shape) if swapped else 0.0)

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        """step_time of each step of a decode run (sim.core.decode_run): only attention
        grows with the contexts, so the other parts are priced once and each step's sum is
        step_time's, part for part in the same order (IEEE sums and products, the same in
        numpy as in plain floats, and commutative; numpy's power is never used). Mirrors
        _counts for a decode-only shape.

        A decode's pairs and KV tokens are the same float (context + n), so the larger of
        its compute and HBM time is that float times the larger per-pair/per-token cost:
        a rounded product never decreases when a positive factor grows."""
        n, layers = shape.num_decodes, self._attn_layers
        # _attention_s and AttentionCost.seconds inlined (the hot loop of a run), operation
        # for operation
        cost = self._decode_attention
        launch_s, min_s, pair_s, token_s = cost.launch_s, cost.min_s, cost.pair_s, cost.token_s
        first = shape.decode_context_sum
        if not self._sliding_share and n:
            head, lm_head_s, cpu_s, collectives_s = self._decode_parts(shape)
            per_token_s = pair_s if pair_s >= token_s else token_s
            tokens0 = first + n  # step s: tokens0 + s * n, an integer (exact as a float)
            if steps >= NUMPY_RUN_STEPS:
                t = np.arange(tokens0, tokens0 + steps * n, n, dtype=np.float64)
                t *= per_token_s
                t += launch_s
                np.maximum(t, min_s, out=t)
                t *= layers
                t += head
                t += lm_head_s
                t += cpu_s
                t += collectives_s
                return t
            out = []
            for s in range(steps):
                t = launch_s + (tokens0 + s * n) * per_token_s
                out.append(head + layers * (t if t >= min_s else min_s) + lm_head_s + cpu_s
                           + collectives_s)
            return np.array(out)
        parts = self._parts(shape)
        if not parts:
            return np.zeros(steps)
        gemms_s, small_s, _, lm_head_s, cpu_s, collectives_s = parts
        head = 0 + gemms_s + small_s  # sum()'s first two additions
        attended = self._attended if self._sliding_share else None
        out = []
        for s in range(steps):
            context = first + s * n if attended is None else attended(first + s * n, n)
            pairs = 0.0 + (context + n)  # each decode also attends to itself
            attention = 0.0
            if pairs:
                compute, memory = pairs * pair_s, float(context + n + 0) * token_s
                t = launch_s + (compute if compute >= memory else memory)
                attention = layers * (t if t >= min_s else min_s)
            out.append(head + attention + lm_head_s + cpu_s + collectives_s + 0.0)
        return np.array(out)

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Every term of step_time (and the kernels' ideal compute and HBM time)."""
        parts = dict.fromkeys((*PARTS, "flops", "bytes", "compute_s", "memory_s"), 0.0)
        parts.update(zip(PARTS, self._parts(shape), strict=False))
        rows, decode, prefill, _, logit_rows = self._counts(shape)
        if rows:
            parts.update(self._work(rows, decode[0] + prefill[0], decode[1] + prefill[1],
                                    logit_rows))
        parts["swap_s"] = self.swap_time_s(shape)
        parts["total_s"] = self.step_time(shape)
        return parts
