"""The capacity sheet's numbers: every term of "what fits, and what bounds a decode step".

A pure function returns a plain dict, so the text sheet (`servesim capacity`,
formatted by sim.cli.capacity), its JSON and the tests all read the same
numbers. Fit is stated, never implied by a zero: the report gives the memory
left (signed) and the smallest tensor-parallel group that holds one sequence
and the whole batch.
"""

from __future__ import annotations

import math
from typing import Any

from sim.config.costs import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    activation_reserve_bytes,
    decode_step_floor_s,
    flops_per_token,
    kv_budget_bytes,
    kv_bytes_per_token,
    max_concurrency,
    max_kv_tokens,
    memory_bound_crossover_batch,
    weights_bytes,
    weights_read_bytes,
)
from sim.config.specs import HardwareSpec, ModelSpec, check_tp, kv_heads_per_gpu


def smallest_fitting_tp(model: ModelSpec, hw: HardwareSpec, sequences: int,
                        context_tokens: int, memory_utilization: float = 0.9,
                        dtype_bytes: float = 2, block_size: int = 16,
                        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> int | None:
    """Fewest GPUs (a tensor-parallel degree vLLM allows) on which `sequences` sequences of
    `context_tokens` fit beside the weights and activations; None if no degree does.

    The candidates stop at num_heads: a larger group cannot split the attention heads.
    """
    for tp in range(1, model.num_heads + 1):
        try:
            check_tp(model, tp)
        except ValueError:
            continue
        activations = activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs,
                                               dtype_bytes, tp)
        if max_concurrency(model, hw, context_tokens, tp, memory_utilization, block_size,
                           dtype_bytes, activations) >= sequences:
            return tp
    return None


def capacity_report(model: ModelSpec, hw: HardwareSpec, tp: int = 1, context_tokens: int = 8192,
                    batch_size: int = 32, memory_utilization: float = 0.9,
                    dtype_bytes: float = 2, block_size: int = 16,
                    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> dict[str, Any]:
    """Every capacity term for `model` on `tp` x `hw`, per GPU, in bytes, seconds and counts."""
    kv_token = kv_bytes_per_token(model, dtype_bytes, tp)
    weights = weights_bytes(model, dtype_bytes, tp)
    activations = activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs,
                                           dtype_bytes, tp)
    kv_batch = kv_token * context_tokens * batch_size
    blocks_per_seq = -(-context_tokens // block_size)
    kv_tokens = max_kv_tokens(model, hw, tp, memory_utilization, activations, dtype_bytes,
                              block_size)
    concurrency = max_concurrency(model, hw, context_tokens, tp, memory_utilization, block_size,
                                  dtype_bytes, activations)
    crossover = memory_bound_crossover_batch(model, hw, context_tokens, tp, dtype_bytes)
    # the textbook figure: the weights-only view, where attention's KV reads are ignored
    crossover_linear = memory_bound_crossover_batch(model, hw, 0, tp, dtype_bytes)
    bw = hw.memory_bandwidth_bytes_per_s
    usable = hw.memory_bytes * memory_utilization
    sizing = {"context_tokens": context_tokens, "memory_utilization": memory_utilization,
              "dtype_bytes": dtype_bytes, "block_size": block_size,
              "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs}
    return {
        "model": model.name, "gpu": hw.name, "tp": tp, "context_tokens": context_tokens,
        "batch_size": batch_size, "memory_utilization": memory_utilization,
        "dtype_bytes": dtype_bytes, "block_size": block_size,
        "num_layers": model.num_layers, "kv_heads_per_gpu": kv_heads_per_gpu(model, tp),
        "head_dim": model.head_dim, "num_heads": model.num_heads,
        "total_params": model.total_params, "active_params": model.active_params,
        "kv_bytes_per_token": kv_token,
        "kv_bytes_context_batch": kv_batch,
        "weights_bytes_per_gpu": weights,
        "gpu_memory_bytes": hw.memory_bytes,
        "usable_memory_bytes": usable,
        "activation_reserve_bytes": activations,
        # signed: negative when weights and activations alone overflow the usable memory
        "memory_left_bytes": usable - weights - activations,
        "weights_fit": weights + activations <= usable,
        "fits": concurrency >= 1,
        "min_gpus_one_sequence": smallest_fitting_tp(model, hw, 1, **sizing),
        "min_gpus_batch": smallest_fitting_tp(model, hw, batch_size, **sizing),
        "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
        "kv_budget_bytes": kv_budget_bytes(model, hw, tp, memory_utilization, activations,
                                           dtype_bytes),
        "kv_budget_tokens": kv_tokens,
        "kv_budget_blocks": kv_tokens // block_size,
        "blocks_per_seq": blocks_per_seq,
        "max_concurrency": concurrency,
        "batch_fits": batch_size <= concurrency,
        "decode_weights_read_bytes": weights_read_bytes(model, batch_size, dtype_bytes, tp),
        "memory_bandwidth_bytes_per_s": bw,
        "decode_step_floor_s": decode_step_floor_s(model, hw, batch_size, context_tokens, tp,
                                                   dtype_bytes),
        "decode_compute_per_seq_s": flops_per_token(model, context_tokens, tp)
        / hw.bf16_flops_per_s,
        "decode_kv_read_per_seq_s": kv_token * context_tokens / bw,
        "crossover_batch": None if math.isinf(crossover) else crossover,
        "crossover_batch_weights_only": crossover_linear,
        "kv_to_weights_ratio": kv_batch / weights,
        "kv_bytes_per_seq": kv_token * context_tokens,
        "kv_seq_to_weights_ratio": kv_token * context_tokens / weights,
        "kv_pool_to_weights_ratio": kv_tokens * kv_token / weights,
        "model_max_context_tokens": model.max_context_tokens,
        "context_exceeds_model": context_tokens > model.max_context_tokens,
    }
