"""Cost formulas over a model and a GPU: bytes, FLOPs, the KV budget, decode floors.

Pure functions, per GPU: under tensor parallelism (`tp`) each GPU holds a
1/tp shard of the matmul weights and of the KV heads. The simulator's KV
budget (sim.assemble), the roofline latency model, the capacity sheet and the
engine's memory check all read these, so they agree by construction.
"""

from __future__ import annotations

import math

from sim.config.specs import (
    HardwareSpec,
    ModelSpec,
    check_positive_int,
    check_tp,
    kv_heads_per_gpu,
    layer_params,
    vocab_params,
)
from sim.core.kv import num_kv_blocks

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's chunked-prefill token budget on big GPUs
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default cap on running sequences


def weights_bytes(model: ModelSpec, dtype_bytes: float = 2, tp: int = 1) -> float:
    """Resident weights on one GPU (all experts, shards plus replicated norms)."""
    check_tp(model, tp)
    params = (model.num_layers * layer_params(model, tp, model.num_experts)
              + vocab_params(model, tp) + model.hidden_size)
    return params * dtype_bytes


def experts_touched(model: ModelSpec, num_tokens: int) -> float:
    """Experts a step reads: min(E, tokens x k), i.e. assumes routing spreads tokens out."""
    return min(model.num_experts, max(num_tokens, 0) * model.experts_per_token)


def weights_read_bytes(model: ModelSpec, num_tokens: int, dtype_bytes: float = 2,
                       tp: int = 1) -> float:
    """Weight bytes one forward step streams from HBM on one GPU.

    Only the experts the step's tokens touch are read, and the embedding table
    is only gathered row by row, so it counts once (as lm_head) when tied and
    not at all otherwise.
    """
    check_tp(model, tp)
    touched = experts_touched(model, max(num_tokens, 1))
    params = (model.num_layers * layer_params(model, tp, touched)
              + model.vocab_size * model.hidden_size / tp + model.hidden_size)
    return params * dtype_bytes


def expert_weight_bytes(model: ModelSpec, dtype_bytes: float = 2, tp: int = 1) -> float:
    """One expert's MLP across all layers on one GPU (the dense MLP when not MoE)."""
    return model.num_layers * 3 * model.hidden_size * model.intermediate_size / tp * dtype_bytes


def kv_bytes_per_token(model: ModelSpec, dtype_bytes: float = 2, tp: int = 1) -> float:
    """K and V for every layer of one token on one GPU."""
    check_tp(model, tp)
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * dtype_bytes


def linear_flops_per_token(model: ModelSpec, tp: int = 1) -> float:
    """2 x active matmul params per layer stack (lm_head excluded), per GPU."""
    return 2 * model.num_layers * layer_params(model, tp, model.experts_per_token)


def lm_head_flops_per_seq(model: ModelSpec, tp: int = 1) -> float:
    return 2 * model.vocab_size * model.hidden_size / tp


def attention_flops_per_pair(model: ModelSpec, tp: int = 1) -> float:
    """QK^T plus AV flops for one query attending to one key, all layers, per GPU."""
    return 4 * model.num_layers * model.num_heads * model.head_dim / tp


def flops_per_token(model: ModelSpec, context_tokens: int, tp: int = 1) -> float:
    """One decode token at `context_tokens` of context: matmuls plus attention."""
    check_tp(model, tp)
    return (linear_flops_per_token(model, tp) + lm_head_flops_per_seq(model, tp)
            + attention_flops_per_pair(model, tp) * context_tokens)


def activation_reserve_bytes(model: ModelSpec,
                             max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                             dtype_bytes: float = 2, tp: int = 1) -> float:
    """Peak forward activations that KV must leave room for.

    vLLM sizes this by profiling one forward pass at the full token budget;
    layers run one after another, so only one layer's buffers are live: the
    residual and normed hidden states, q/k/v, attention output, and the MLP's
    gate/up/act buffers, plus fp32 logits and the sampler's probabilities for
    every sequence (gathered to the full vocab on each GPU).
    """
    check_tp(model, tp)
    h = model.hidden_size
    qkv = (model.num_heads // tp + 2 * kv_heads_per_gpu(model, tp)) * model.head_dim
    mlp = 3 * model.intermediate_size * model.experts_per_token / tp
    per_token = (4 * h + qkv + mlp) * dtype_bytes
    logits = 2 * max_num_seqs * model.vocab_size * 4
    return max_num_batched_tokens * per_token + logits


def kv_budget_bytes(model: ModelSpec, hw: HardwareSpec, tp: int = 1,
                    memory_utilization: float = 0.9, activation_reserve: float | None = None,
                    dtype_bytes: float = 2) -> float:
    """GPU memory x utilisation - weights - activation reserve (never negative)."""
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization!r}")
    if activation_reserve is None:
        activation_reserve = activation_reserve_bytes(model, dtype_bytes=dtype_bytes, tp=tp)
    free = (hw.memory_bytes * memory_utilization - weights_bytes(model, dtype_bytes, tp)
            - activation_reserve)
    return max(0.0, free)


def _num_blocks(model: ModelSpec, hw: HardwareSpec, tp: int, memory_utilization: float,
                activation_reserve: float | None, dtype_bytes: float, block_size: int) -> int:
    check_positive_int("block_size", block_size)
    if activation_reserve is None:
        activation_reserve = activation_reserve_bytes(model, dtype_bytes=dtype_bytes, tp=tp)
    kv_budget_bytes(model, hw, tp, memory_utilization, activation_reserve, dtype_bytes)  # checks
    return num_kv_blocks(hw.memory_bytes, memory_utilization, weights_bytes(model, dtype_bytes, tp),
                         activation_reserve, kv_bytes_per_token(model, dtype_bytes, tp), block_size)


def max_kv_tokens(model: ModelSpec, hw: HardwareSpec, tp: int = 1,
                  memory_utilization: float = 0.9, activation_reserve: float | None = None,
                  dtype_bytes: float = 2, block_size: int = 16) -> int:
    """Tokens of KV the budget holds, rounded down to whole blocks."""
    blocks = _num_blocks(model, hw, tp, memory_utilization, activation_reserve, dtype_bytes,
                         block_size)
    return blocks * block_size


def max_concurrency(model: ModelSpec, hw: HardwareSpec, context_tokens: int, tp: int = 1,
                    memory_utilization: float = 0.9, block_size: int = 16,
                    dtype_bytes: float = 2, activation_reserve: float | None = None) -> int:
    """Sequences of `context_tokens` each that fit at once, each owning whole blocks."""
    check_positive_int("context_tokens", context_tokens)
    blocks = _num_blocks(model, hw, tp, memory_utilization, activation_reserve, dtype_bytes,
                         block_size)
    return blocks // -(-context_tokens // block_size)


def allreduce_time_s(num_bytes: float, tp: int, hw: HardwareSpec) -> float:
    """Ring all-reduce: each GPU sends and receives 2(tp-1)/tp of the buffer."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * num_bytes / hw.interconnect_bandwidth_bytes_per_s


def decode_step_floor_s(model: ModelSpec, hw: HardwareSpec, batch_size: int,
                        context_tokens: int, tp: int = 1, dtype_bytes: float = 2) -> float:
    """HBM floor of one decode step: weights once plus every sequence's KV."""
    read = (weights_read_bytes(model, batch_size, dtype_bytes, tp)
            + batch_size * context_tokens * kv_bytes_per_token(model, dtype_bytes, tp))
    return read / hw.memory_bandwidth_bytes_per_s


def memory_bound_crossover_batch(model: ModelSpec, hw: HardwareSpec, context_tokens: int,
                                 tp: int = 1, dtype_bytes: float = 2) -> float:
    """Decode batch at which compute time equals HBM time (same formulas as the floor).

    Per sequence, a decode adds flops_per_token of compute and its KV of
    traffic; weights are shared. If each added sequence costs more HBM time
    than compute time (GQA attention at long context), the batch never turns
    compute-bound and this returns inf. Memory capacity is not applied here:
    compare with max_concurrency to see whether the crossover is reachable.
    """
    per_seq_compute_s = flops_per_token(model, context_tokens, tp) / hw.bf16_flops_per_s
    per_seq_kv_s = (context_tokens * kv_bytes_per_token(model, dtype_bytes, tp)
                    / hw.memory_bandwidth_bytes_per_s)
    slope_s = per_seq_compute_s - per_seq_kv_s
    if slope_s <= 0:
        return math.inf
    bw = hw.memory_bandwidth_bytes_per_s
    if model.is_moe:  # while batch x k < E, each sequence also pulls in k more experts
        expert_s = expert_weight_bytes(model, dtype_bytes, tp) / bw
        one_token_s = weights_read_bytes(model, 1, dtype_bytes, tp) / bw
        shared_s = one_token_s - model.experts_per_token * expert_s
        growing_slope_s = slope_s - model.experts_per_token * expert_s
        if growing_slope_s > 0:
            batch = shared_s / growing_slope_s
            if batch * model.experts_per_token < model.num_experts:
                return batch
    return weights_read_bytes(model, 10**9, dtype_bytes, tp) / bw / slope_s

