"""Cost formulas over a model and a GPU: bytes, FLOPs, the KV budget, decode floors.

Pure functions, per GPU: under tensor parallelism (`tp`) each GPU holds a
1/tp shard of the matmul weights and of the KV heads. The simulator's KV
budget (sim.assemble), the roofline latency model, the capacity sheet and the
engine's memory check all read these, so they agree by construction.
"""

from __future__ import annotations

import math

from sim.config.attention import (
    attended_tokens,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    layer_counts,
    linear_state_bytes,
)
from sim.config.checks import check_positive_int
from sim.config.hardware import HardwareSpec
from sim.config.moe import experts_touched_per_gpu
from sim.config.specs import (
    ModelSpec,
    check_ep,
    check_tp,
    expert_params,
    kv_heads_per_gpu,
    params_by_part,
    part_bytes,
)
from sim.core.kv import num_kv_blocks

__all__ = ["kv_bytes_per_token", "kv_bytes_per_sequence", "linear_state_bytes"]

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's chunked-prefill token budget on big GPUs
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default cap on running sequences


def _stored_bytes(model: ModelSpec, params: dict[str, float]) -> float:
    sizes = part_bytes(model)
    return sum(count * sizes[part] for part, count in params.items())


def weights_bytes(model: ModelSpec, tp: int = 1, ep: int = 1, dp: int = 1) -> float:
    """Resident weights on one GPU (all its experts, shards plus replicated norms), each
    part in the dtype it is stored in, scales included; under expert parallelism each
    GPU holds num_experts / ep whole experts (with `dp` data-parallel attention ranks,
    ep = dp x tp: each rank's tp GPUs hold its own copy of the rest)."""
    check_tp(model, tp)
    check_ep(model, tp, ep, dp)
    return _stored_bytes(model, params_by_part(model, tp, model.num_experts / ep, ep))


def experts_touched(model: ModelSpec, num_tokens: float, ep: int = 1) -> float:
    """Distinct experts per MoE layer a step of `num_tokens` reads on its busiest GPU:
    E (1 - (1 - k/E)^tokens) under uniform routing, fewer under routing_skew
    (sim.config.moe); a 1/ep share of them under expert parallelism."""
    if not model.is_moe:
        return 1.0
    return experts_touched_per_gpu(model.num_experts, model.experts_per_token,
                                   max(num_tokens, 0), ep, model.routing_skew)


def weights_read_bytes(model: ModelSpec, num_tokens: float, tp: int = 1, ep: int = 1) -> float:
    """Weight bytes one forward step streams from HBM on one GPU.

    Only the experts the step's tokens touch are read, and the embedding table
    is only gathered row by row, so it counts once (as lm_head) when tied and
    not at all otherwise.
    """
    check_tp(model, tp)
    params = params_by_part(model, tp, experts_touched(model, max(num_tokens, 1), ep), ep)
    params["vocab"] = model.vocab_size * model.hidden_size / tp
    return _stored_bytes(model, params)


def expert_weight_bytes(model: ModelSpec, tp: int = 1, ep: int = 1) -> float:
    """One routed expert's MLP across its layers on one GPU, in expert_dtype (whole under
    expert parallelism; the dense MLP across all layers when not MoE)."""
    layers = model.moe_layers if model.is_moe else model.num_layers
    mlp = expert_params(model, 1 if ep > 1 else tp) if model.is_moe else \
        3 * model.hidden_size * model.intermediate_size / tp
    return layers * mlp * model.experts.bytes_per_element


def linear_flops_by_part(model: ModelSpec, tp: int = 1) -> dict[str, float]:
    """Per token on one GPU, 2 x the active matmul params of each stored part (lm_head
    excluded): the roofline charges "weights" and "experts" at their dtypes' rates."""
    params = params_by_part(model, tp, model.experts_per_token)
    del params["vocab"]
    params["carrier"] -= model.hidden_size  # the final norm is no matmul row's work
    return {part: 2 * count for part, count in params.items()}


def linear_flops_per_token(model: ModelSpec, tp: int = 1) -> float:
    """2 x active matmul params per layer stack (lm_head excluded), per GPU."""
    return sum(linear_flops_by_part(model, tp).values())


def lm_head_flops_per_seq(model: ModelSpec, tp: int = 1) -> float:
    return 2 * model.vocab_size * model.hidden_size / tp


def attention_flops_per_pair(model: ModelSpec, tp: int = 1) -> float:
    """QK^T plus AV flops for one query attending to one key, all attending layers, per GPU.

    MLA is priced in its absorbed form (vLLM's decode path): each head's query meets the
    latent plus rope key (kv_lora_rank + qk_rope_head_dim) and its output is a latent
    (kv_lora_rank) wide. Linear/SSM layers' per-token work is not counted.
    """
    counts = layer_counts(model)
    layers = counts["full"] + counts["sliding"]
    if model.attention == "mla":
        width = 2 * model.kv_lora_rank + model.qk_rope_head_dim
        return 2 * layers * model.num_heads * width / tp
    return 4 * layers * model.num_heads * model.head_dim / tp


def flops_per_token(model: ModelSpec, context_tokens: int, tp: int = 1) -> float:
    """One decode token at `context_tokens` of context: matmuls plus attention."""
    check_tp(model, tp)
    return (linear_flops_per_token(model, tp) + lm_head_flops_per_seq(model, tp)
            + attention_flops_per_pair(model, tp) * attended_tokens(model, context_tokens, 1))


def activation_reserve_bytes(model: ModelSpec,
                             max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                             tp: int = 1) -> float:
    """Peak forward activations that KV must leave room for.

    vLLM sizes this by profiling one forward pass at the full token budget;
    layers run one after another, so only one layer's buffers are live: the
    residual and normed hidden states, q/k/v, attention output, and the MLP's
    gate/up/act buffers, plus fp32 logits and the sampler's probabilities for
    every sequence (gathered to the full vocab on each GPU). Activations are in the
    carrier dtype (bf16 for quantised weights).
    """
    check_tp(model, tp)
    per_token = activation_elements_per_token(model, tp) * model.carrier.bytes_per_element
    logits = 2 * max_num_seqs * model.vocab_size * 4
    return max_num_batched_tokens * per_token + logits


def activation_elements_per_token(model: ModelSpec, tp: int = 1) -> float:
    """One layer's live buffers per token: hidden states, q/k/v, attention out, MLP."""
    h = model.hidden_size
    qkv = (model.num_heads // tp + 2 * kv_heads_per_gpu(model, tp)) * model.head_dim
    width = model.expert_intermediate_size if model.moe_layers else model.intermediate_size
    mlp = 3 * width * (model.experts_per_token + model.num_shared_experts) / tp
    return 4 * h + qkv + mlp


def kv_budget_bytes(model: ModelSpec, hw: HardwareSpec, tp: int = 1,
                    memory_utilization: float = 0.9,
                    activation_reserve: float | None = None, ep: int = 1) -> float:
    """GPU memory x utilisation - weights - activation reserve (never negative)."""
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization!r}")
    if activation_reserve is None:
        activation_reserve = activation_reserve_bytes(model, tp=tp)
    free = (hw.memory_bytes * memory_utilization - weights_bytes(model, tp, ep)
            - activation_reserve)
    return max(0.0, free)


def state_reserve_bytes(model: ModelSpec, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                        tp: int = 1) -> float:
    """Linear/SSM layers' constant state for every sequence that may run at once: the
    simulator's pool sets it aside beside the activations (0 for attention-only models)."""
    return max_num_seqs * linear_state_bytes(model, tp)


def _num_blocks(model: ModelSpec, hw: HardwareSpec, tp: int, memory_utilization: float,
                activation_reserve: float | None, block_size: int, ep: int = 1) -> int:
    check_positive_int("block_size", block_size)
    if activation_reserve is None:
        activation_reserve = activation_reserve_bytes(model, tp=tp)
    kv_budget_bytes(model, hw, tp, memory_utilization, activation_reserve, ep)  # checks
    return num_kv_blocks(hw.memory_bytes, memory_utilization, weights_bytes(model, tp, ep),
                         activation_reserve, kv_bytes_per_token(model, tp), block_size)


def max_kv_tokens(model: ModelSpec, hw: HardwareSpec, tp: int = 1,
                  memory_utilization: float = 0.9, activation_reserve: float | None = None,
                  block_size: int = 16, ep: int = 1) -> int:
    """Tokens of KV the budget holds at kv_bytes_per_token, rounded down to whole blocks."""
    return _num_blocks(model, hw, tp, memory_utilization, activation_reserve,
                       block_size, ep) * block_size


def max_concurrency(model: ModelSpec, hw: HardwareSpec, context_tokens: int, tp: int = 1,
                    memory_utilization: float = 0.9, block_size: int = 16,
                    activation_reserve: float | None = None, ep: int = 1) -> int:
    """Sequences of `context_tokens` each that fit at once, each owning whole blocks per
    layer group: full layers the whole context, sliding layers their window, linear layers
    their state (kv_bytes_per_sequence). For full attention this is blocks // blocks per
    sequence."""
    check_positive_int("context_tokens", context_tokens)
    check_positive_int("block_size", block_size)
    free = kv_budget_bytes(model, hw, tp, memory_utilization, activation_reserve, ep)
    return int(free // kv_bytes_per_sequence(model, context_tokens, tp, block_size))


def allreduce_time_s(num_bytes: float, tp: int, hw: HardwareSpec) -> float:
    """Ring all-reduce: each GPU sends and receives 2(tp-1)/tp of the buffer."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * num_bytes / hw.interconnect_bandwidth_bytes_per_s


def linear_compute_s_per_token(model: ModelSpec, hw: HardwareSpec, tp: int = 1) -> float:
    """Seconds of one token's matmuls at peak, each stored part at its dtype's tensor-core
    rate (fp8 weights on fp8 tensor cores; weight-only int4 at bf16's rate)."""
    rates = {"weights": model.weights.compute, "experts": model.experts.compute}
    return sum(flops / hw.flops_per_s(rates.get(part, "bf16"))
               for part, flops in linear_flops_by_part(model, tp).items())


def decode_compute_s_per_seq(model: ModelSpec, hw: HardwareSpec, context_tokens: int,
                             tp: int = 1) -> float:
    """One decode token's compute at peak: matmuls at their dtypes' rates, lm_head and
    attention at bf16's."""
    other = flops_per_token(model, context_tokens, tp) - linear_flops_per_token(model, tp)
    return linear_compute_s_per_token(model, hw, tp) + other / hw.bf16_flops_per_s


def decode_step_floor_s(model: ModelSpec, hw: HardwareSpec, batch_size: float,
                        context_tokens: int, tp: int = 1, ep: int = 1) -> float:
    """HBM floor of one decode step: weights once plus every sequence's KV."""
    read = (weights_read_bytes(model, batch_size, tp, ep)
            + batch_size * kv_bytes_per_sequence(model, context_tokens, tp))
    return read / hw.memory_bandwidth_bytes_per_s


def memory_bound_crossover_batch(model: ModelSpec, hw: HardwareSpec, context_tokens: int,
                                 tp: int = 1, ep: int = 1) -> float:
    """Decode batch at which compute time equals HBM time (same formulas as the floor).

    Per sequence, a decode adds its compute and its KV of traffic; weights are shared,
    and a MoE batch also pulls in more distinct experts as it grows (concavely, see
    sim.config.moe). If each added sequence costs more HBM time than compute time (GQA
    attention at long context), the batch never turns compute-bound and this returns
    inf. Memory capacity is not applied here: compare with max_concurrency to see whether
    the crossover is reachable.
    """
    per_seq_compute_s = decode_compute_s_per_seq(model, hw, context_tokens, tp)
    per_seq_kv_s = (kv_bytes_per_sequence(model, context_tokens, tp)
                    / hw.memory_bandwidth_bytes_per_s)
    slope_s = per_seq_compute_s - per_seq_kv_s
    if slope_s <= 0:
        return math.inf
    bw = hw.memory_bandwidth_bytes_per_s
    if not model.is_moe:
        return weights_read_bytes(model, 1, tp) / bw / slope_s

    def surplus_s(batch: float) -> float:  # convex: compute minus HBM time
        return batch * per_seq_compute_s - decode_step_floor_s(model, hw, batch,
                                                               context_tokens, tp, ep)

    low, high = 1e-9, 1.0
    while surplus_s(high) < 0:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if surplus_s(mid) < 0 else (low, mid)
        if high - low <= 1e-12 * high:
            break
    return high
