"""A roofline step's parts: a shape's rows and pairs, each part priced, the fixed ones remembered.

Apart from sim.latency.roofline because this is the pricing of one step's shape, part
by part (GEMMs, small kernels, attention, lm_head and sampling, CPU, collectives) in
PARTS' order, with the memos that make repeated shapes cheap; RooflineLatency builds
the state these methods read (from the specs, once) and adds the parts up. The mixin
keeps no state of its own: the attributes annotated here are RooflineLatency's fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from sim.config.attention import attended_tokens
from sim.config.costs import experts_touched
from sim.config.link import Link, all_to_all_s, allreduce_s
from sim.config.moe import dispatch_bytes_per_gpu
from sim.core.plan import StepShape
from sim.latency.roofline_layers import LayerGroup
from sim.latency.roofline_terms import (
    AttentionCost,
    GemmCost,
    LayerDims,
    cpu_overhead_s,
    sampling_s,
    small_kernels_s,
)

if TYPE_CHECKING:
    from sim.config.hardware import HardwareSpec
    from sim.config.specs import ModelSpec
    from sim.latency.roofline_fits import RooflineParams

# Row counts whose context-free parts a model remembers (see RooflineLatency._fixed_parts);
# past it the memo starts again, so memory stays bounded by the budget's row counts.
MEMO_SHAPES = 4096


class PricedGroup(NamedTuple):
    """A LayerGroup with its GEMMs' fitted costs, derived once.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    group: LayerGroup
    dense: tuple[GemmCost, ...]
    experts: tuple[GemmCost, ...]


class RooflineParts:
    """RooflineLatency's pricing of one step's shape, part by part (see the module)."""

    __slots__ = ()
    model: ModelSpec
    hardware: HardwareSpec
    tp: int
    ep: int
    dp: int
    _p: RooflineParams
    _dims: LayerDims
    _groups: tuple[PricedGroup, ...]
    _lm_head: GemmCost
    _decode_attention: AttentionCost
    _prefill_attention: AttentionCost
    _act_bytes: float
    _attn_layers: int
    host_serial_share: float
    _sliding_share: float
    _attn_flops_per_pair: float
    _kv_bytes_per_token: float
    _flops_per_s: float
    _bytes_per_s: float
    _link: Link
    _allreduces: int
    _allreduce_bytes_per_token: float
    _memo: dict[float, tuple[float, float, float]]
    _seqs_memo: dict[tuple[float, float], tuple[float, float]]
    _decode_memo: dict[tuple[int, int], tuple[float, float, float, float]]

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
        """Tensor parallelism's all-reduces of the rows' hidden states; under ep each MoE
        layer's two all-to-alls (dispatch to the experts' GPUs, combine back), all over
        the GPU's link (sim.config.link: its latency and bus bandwidth)."""
        if self.tp == 1:
            return 0.0
        seconds = self._allreduces * allreduce_s(
            self._link, rows * self._allreduce_bytes_per_token, self.tp)
        if self.ep > 1 and self.dp == 1:  # dp > 1: the lockstep group prices them
            m = self.model
            seconds += 2 * m.moe_layers * all_to_all_s(self._link, dispatch_bytes_per_gpu(
                rows, m.experts_per_token, m.hidden_size, self._act_bytes, self.ep), self.ep)
        return seconds

    def _attention_s(self, decode: tuple[float, float], prefill: tuple[float, float]
                     ) -> float:
        """Every attending layer's attention: one kernel a layer. Decodes alone run the
        decode kernel; a step with a prefill chunk runs one prefill-style kernel over every
        sequence's pairs and KV (vLLM V1's FlashAttention backend calls
        flash_attn_varlen_func once for the whole mixed batch), so it pays one launch and
        one minimum, not a decode kernel's and a prefill kernel's."""
        if not prefill[0]:
            seconds = self._decode_attention.seconds(*decode) if decode[0] else 0.0
        else:
            seconds = self._prefill_attention.seconds(decode[0] + prefill[0],
                                                      decode[1] + prefill[1])
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
        """The parts that do not depend on the contexts (all but attention), remembered:
        those of the rows apart from those of the sequences (a prefill step's rows are
        new with nearly every prompt, its sequences are not)."""
        by_rows = self._memo.get(rows)
        if by_rows is None:
            p, b = self._p, self._bytes_per_s
            small = 0.0
            for g in self._groups:
                small += g.group.layers * small_kernels_s(g.group.dims, rows, b, p,
                                                          self._act_bytes)
            by_rows = (self._gemms_s(rows), small, self._collectives_s(rows))
            _remember(self._memo, rows, by_rows)
        key = (seqs, logit_rows)
        by_seqs = self._seqs_memo.get(key)
        if by_seqs is None:
            p, dims, b = self._p, self._dims, self._bytes_per_s
            by_seqs = (self._lm_head.seconds(logit_rows) + sampling_s(dims, logit_rows, b, p),
                       cpu_overhead_s(seqs, p))
            _remember(self._seqs_memo, key, by_seqs)
        return by_rows[0], by_rows[1], by_seqs[0], by_seqs[1], by_rows[2]

    def _decode_parts(self, shape: StepShape) -> tuple[float, float, float, float]:
        """A plain-decode step's parts but attention (sum()'s first two added), remembered
        by batch size and padding: all it depends on."""
        key = (shape.num_decodes, shape.padded_batch)
        parts = self._decode_memo.get(key)
        if parts is None:
            gemms_s, small_s, _, lm_head_s, cpu_s, collectives_s = self._parts(shape)
            parts = (0 + gemms_s + small_s, lm_head_s, cpu_s, collectives_s)
            _remember(self._decode_memo, key, parts)
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


def _remember(memo: dict, key: object, value: object) -> None:
    """memo[key] = value, the memo started again once it holds MEMO_SHAPES entries."""
    if len(memo) >= MEMO_SHAPES:
        memo.clear()
    memo[key] = value
