"""A MoE step under data-parallel attention with expert parallelism, priced by where tokens go.

N attention ranks of T GPUs each step in lockstep; the routed experts are dealt round robin
over all G = N x T GPUs (expert i on GPU i mod G). One MoE layer runs, on every GPU:
dispatch (an all-to-all sending each token's hidden state to the GPUs of its k experts),
the GPU's experts over the rows routed to them (one fused launch per matrix, as vLLM's
fused_moe), and combine (the all-to-all back). Each waits for the slowest GPU, so a
layer costs max dispatch + max experts + max combine; every layer alike, a step adds
moe_layers of them to the slowest rank's own time (attention, dense layers, shared experts,
router, lm_head, host: the rank's roofline, sim.latency.roofline with `dp`).

Where tokens go (routing probabilities p_i of sim.config.moe, Zipf(skew), summing to k):
- GPU g's experts receive a share s_g = sum of p_i over its experts / k of all picks;
- a rank's rows are split evenly over its T GPUs for dispatch (vLLM's sequence-parallel
  MoE input), t_g each;
- a token is sent once to each other GPU holding at least one of its k experts, not once
  per expert: DeepEP's high-throughput dispatch sends a token once per destination rank
  (and the receiver reduces its experts' outputs into one combine message); vLLM's
  gather-based backends (every token to every GPU) are not modelled. GPU h is hit with probability
  q_h = 1 - prod over its experts of (1 - p_i) (picks independent across experts);
- dispatch sends t_g (Q - q_g) hidden states off GPU g (Q = sum of q_h) and brings it
  (tokens - t_g) q_g; combine the reverse. Summed over GPUs, one direction moves
  tokens x remote copies x hidden x dtype_bytes: `all_to_all_bytes`. Per-expert messages
  (k (1 - s_g) a token, DeepEP's low-latency kernels) are not modelled; nor is one copy
  per node across nodes.
- One all-to-all takes the link's latency plus the busiest GPU's bytes (sent or received,
  whichever is more) over its bandwidth (sim.config.link: the one Link value).
- GPU g's experts run over tokens x k x s_g rows; the distinct experts they touch are
  sum over its experts of 1 - (1 - p_i)^tokens, each expert's weights read once.
Host time: synchronously each rank's host work precedes its kernels (the slowest rank's
sum); under async scheduling the slowest host hides behind the whole step's GPU time.

Pure functions, then `DPEPGroupLatency`, which prices a lockstep step from the ranks' shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.config.link import Link, transfer_s
from sim.config.moe import routing_probabilities
from sim.config.specs import ModelSpec
from sim.core.plan import StepShape
from sim.latency.roofline import RooflineLatency
from sim.latency.roofline_layers import layer_groups
from sim.latency.roofline_terms import GemmCost, cpu_overhead_s, gemm_cost, visible_host_s

# What an idle rank runs so the collectives have every GPU (vLLM's execute_dummy_batch):
# one token, no context.
DUMMY_SHAPE = StepShape(num_decodes=1, padded_batch=1)


def gpu_route_shares(num_experts: int, top_k: int, gpus: int, skew: float = 0.0
                     ) -> tuple[float, ...]:
    """Share of all (token, expert) picks landing on each GPU's experts (round robin)."""
    probs = routing_probabilities(num_experts, top_k, skew)
    return tuple(sum(probs[g::gpus]) / top_k for g in range(gpus))


def gpu_hit_probabilities(num_experts: int, top_k: int, gpus: int, skew: float = 0.0
                          ) -> tuple[float, ...]:
    """Probability that a token's k experts include at least one on each GPU: the GPUs a
    deduplicating dispatch sends it to (see the module)."""
    probs = routing_probabilities(num_experts, top_k, skew)
    return tuple(1 - math.prod(1 - min(1.0, p) for p in probs[g::gpus]) for g in range(gpus))


def gpu_experts_touched(num_experts: int, top_k: int, tokens: float, gpus: int,
                        skew: float = 0.0) -> tuple[float, ...]:
    """Distinct experts each GPU's `tokens` x k picks touch (see the module)."""
    if tokens <= 0:
        return (0.0,) * gpus
    probs = routing_probabilities(num_experts, top_k, skew)
    return tuple(sum(1 - (1 - p) ** tokens for p in probs[g::gpus]) for g in range(gpus))


def all_to_all_bytes(tokens: float, remote_copies: float, hidden_size: int,
                     dtype_bytes: float) -> float:
    """Bytes one all-to-all (dispatch or combine) moves between GPUs, all GPUs together:
    tokens x remote copies a token (the other GPUs its experts are on) x hidden x
    dtype_bytes, one direction."""
    if remote_copies < 0:
        raise ValueError(f"remote_copies must be >= 0, got {remote_copies!r}")
    return tokens * remote_copies * hidden_size * dtype_bytes


def dispatch_traffic(tokens_by_gpu: Sequence[float], hits: Sequence[float],
                     token_bytes: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(sent, received) bytes of each GPU in one dispatch; combine swaps the two.

    GPU g sends each of its tokens once to every other GPU its experts are on (q_h each,
    `hits`: gpu_hit_probabilities) and receives each other GPU's tokens with probability
    q_g. `token_bytes`: hidden x dtype_bytes."""
    total, spread = sum(tokens_by_gpu), math.fsum(hits)
    sent = tuple(t * (spread - q) * token_bytes
                 for t, q in zip(tokens_by_gpu, hits, strict=True))
    received = tuple((total - t) * q * token_bytes
                     for t, q in zip(tokens_by_gpu, hits, strict=True))
    return sent, received


def all_to_all_s(link: Link, sent: Sequence[float], received: Sequence[float]) -> float:
    """One all-to-all: the link's latency plus the busiest GPU's bytes at its bandwidth
    (nothing to move costs 0)."""
    busiest = max(max(sent), max(received))
    return transfer_s(link, busiest)


def experts_gemm_s(costs: Sequence[GemmCost], touched: float, rows: float) -> float:
    """One GPU's routed experts in one MoE layer: a fused launch per matrix, each touched
    expert's weight read and tiles over its rows (sim.latency.roofline_parts' law)."""
    if touched <= 0:
        return 0.0
    per_expert = rows / touched
    return sum(c.launch_s + touched * (c.seconds(per_expert) - c.launch_s) for c in costs)


def shape_rows(shape: StepShape) -> int:
    """Token rows a step's GEMMs run over: prefill chunks, decodes, drafts, padded slots."""
    seqs = len(shape.prefill_chunk_tokens) + shape.num_decodes
    return (sum(shape.prefill_chunk_tokens) + shape.num_decodes + shape.num_spec_tokens
            + max(0, shape.padded_batch - seqs))


@dataclass(frozen=True, slots=True)
class DPEPGroupLatency:
    """A lockstep step of `dp` ranks x `tp` GPUs with the experts over all of them.

    `rank`: one rank's roofline with `dp` set (its routed experts left out; every rank is
    alike, so one prices all). step_time takes each rank's shape (None: idle, a dummy
    batch) and returns the slowest rank's time plus the MoE layers' all-to-alls and
    expert GEMMs on the slowest GPU.
    """

    rank: RooflineLatency
    link: Link
    # async scheduling: the share of the host's time serial with the GPU (1: synchronous);
    # the rank's roofline prices host and GPU serially, the group overlaps them
    host_serial_share: float = 1.0
    name: str = "roofline"
    _probs: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _shares: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _hits: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _costs: tuple[GemmCost, ...] = field(init=False, repr=False, compare=False)
    _memo: dict[tuple[int, ...], tuple[float, float]] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        r, m = self.rank, self.rank.model
        if r.dp < 2:
            raise ValueError(f"a DP/EP group needs a rank roofline with dp >= 2, got {r.dp}")
        if r.host_serial_share != 1.0:
            raise ValueError("the rank's roofline must be synchronous (host_serial_share 1); "
                             "the group overlaps host and GPU (its own host_serial_share)")
        if not 0 <= self.host_serial_share <= 1:
            raise ValueError(f"host_serial_share must be in [0, 1], "
                             f"got {self.host_serial_share!r}")
        p, hw = r.fitted, r.hardware
        bw, act = hw.memory_bandwidth_bytes_per_s, m.carrier.bytes_per_element
        experts = layer_groups(m, hw, r.tp, self.gpus)[-1].experts
        object.__setattr__(self, "_probs", tuple(routing_probabilities(
            m.num_experts, m.experts_per_token, m.routing_skew)))
        object.__setattr__(self, "_shares", gpu_route_shares(
            m.num_experts, m.experts_per_token, self.gpus, m.routing_skew))
        object.__setattr__(self, "_hits", gpu_hit_probabilities(
            m.num_experts, m.experts_per_token, self.gpus, m.routing_skew))
        object.__setattr__(self, "_costs", tuple(
            gemm_cost(g.k, g.n, g.flops_per_s, bw, p, g.weight_bytes, act, g.tile_scale)
            for g in experts))
        object.__setattr__(self, "_memo", {})

    @property
    def model(self) -> ModelSpec:
        return self.rank.model

    @property
    def dp(self) -> int:
        return self.rank.dp

    @property
    def gpus(self) -> int:
        return self.rank.dp * self.rank.tp

    def moe_layer_s(self, rows_by_rank: Sequence[int]) -> tuple[float, float]:
        """(one all-to-all's seconds, the slowest GPU's expert GEMMs' seconds) of one MoE
        layer, given each rank's rows."""
        key = tuple(rows_by_rank)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        m, tp = self.model, self.rank.tp
        tokens = float(sum(key))
        per_gpu = [rows / tp for rows in key for _ in range(tp)]
        sent, received = dispatch_traffic(per_gpu, self._hits,
                                          m.hidden_size * m.carrier.bytes_per_element)
        a2a_s = all_to_all_s(self.link, sent, received)
        gpus, probs = self.gpus, self._probs
        touched = [sum(1 - (1 - p) ** tokens for p in probs[g::gpus]) for g in range(gpus)]
        experts_s = max(experts_gemm_s(self._costs, t, tokens * m.experts_per_token * s)
                        for t, s in zip(touched, self._shares, strict=True))
        if len(self._memo) >= 4096:
            self._memo.clear()
        self._memo[key] = (a2a_s, experts_s)
        return a2a_s, experts_s

    def lockstep(self, shapes: Sequence[StepShape | None],
                 moved_s: Sequence[float] = ()) -> tuple[float, list[float]]:
        """(the step's seconds, each rank's own seconds): the slowest rank, then per MoE
        layer a dispatch, the slowest GPU's experts and a combine. A rank's shape None is
        idle: it runs the dummy batch. `moved_s`: each rank's synchronous KV moves on idle
        links (RooflineLatency.step_time; empty: none)."""
        if len(shapes) != self.dp:
            raise ValueError(f"a step of {self.dp} ranks needs {self.dp} shapes, "
                             f"got {len(shapes)}")
        rank_time, params = self.rank.step_time, self.rank.fitted
        rank_s, rows, host_s = [], [], []
        for i, shape in enumerate(shapes):
            run = DUMMY_SHAPE if shape is None else shape
            # GPU and host, serially (the rank's roofline)
            rank_s.append(rank_time(run, moved_s[i]) if moved_s else rank_time(run))
            rows.append(shape_rows(run))
            host_s.append(cpu_overhead_s(len(run.prefill_chunk_tokens) + run.num_decodes,
                                         params))
        a2a_s, experts_s = self.moe_layer_s(rows)
        moe_s = self.model.moe_layers * (2 * a2a_s + experts_s)
        share = self.host_serial_share
        if share >= 1.0:  # synchronous: each rank's host work, then its kernels
            return max(rank_s) + moe_s, rank_s
        gpu_s = max(r - h for r, h in zip(rank_s, host_s, strict=True)) + moe_s
        return gpu_s + visible_host_s(max(host_s), gpu_s, share), rank_s

    def step_time(self, shapes: Sequence[StepShape | None]) -> float:
        """Seconds for one lockstep step (see lockstep)."""
        return self.lockstep(shapes)[0]

    def breakdown(self, shapes: Sequence[StepShape | None]) -> dict[str, float]:
        """The lockstep step's terms: each rank's own time, the slowest, the MoE layers'."""
        total_s, rank_s = self.lockstep(shapes)
        a2a_s, experts_s = self.moe_layer_s(
            [shape_rows(DUMMY_SHAPE if s is None else s) for s in shapes])
        layers = self.model.moe_layers
        out = {f"rank{i}_s": t for i, t in enumerate(rank_s)}
        out.update(slowest_rank_s=max(rank_s), mean_rank_s=sum(rank_s) / len(rank_s),
                   all_to_all_s=2 * layers * a2a_s, experts_s=layers * experts_s,
                   total_s=total_s)
        return out

    def output_lag_s(self, shape: StepShape) -> float:
        """How long after the step a rank's tokens leave the engine: under async scheduling
        its overlapped host work (as sim.latency.roofline.RooflineLatency.output_lag_s)."""
        if self.host_serial_share >= 1.0:
            return 0.0
        seqs = len(shape.prefill_chunk_tokens) + shape.num_decodes
        return (1.0 - self.host_serial_share) * cpu_overhead_s(seqs, self.rank.fitted)
