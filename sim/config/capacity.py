"""The capacity sheet's numbers: every term of "what fits, and what bounds a decode step".

A pure function returns a plain dict, so the text sheet (`servesim capacity`,
formatted by sim.cli.capacity_sheet), its JSON and the tests all read the same
numbers. Fit is stated, never implied by a zero: the report gives the memory
left (signed) and the smallest tensor-parallel group that holds one sequence
and the whole batch.
"""

from __future__ import annotations

import math
from typing import Any

from sim.config.attention import layer_bytes_per_token, layer_counts
from sim.config.costs import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    activation_reserve_bytes,
    decode_compute_s_per_seq,
    decode_step_floor_s,
    experts_touched,
    kv_budget_bytes,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    linear_state_bytes,
    max_concurrency,
    max_kv_tokens,
    memory_bound_crossover_batch,
    state_reserve_bytes,
    weights_bytes,
    weights_read_bytes,
)
from sim.config.hardware import HardwareSpec
from sim.config.specs import ModelSpec, check_ep, check_tp, kv_heads_per_gpu


def smallest_fitting_tp(model: ModelSpec, hw: HardwareSpec, sequences: int,
                        context_tokens: int, memory_utilization: float = 0.9,
                        block_size: int = 16,
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
        activations = (activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
                       + state_reserve_bytes(model, max_num_seqs, tp))
        if max_concurrency(model, hw, context_tokens, tp, memory_utilization, block_size,
                           activations) >= sequences:
            return tp
    return None


def capacity_report(model: ModelSpec, hw: HardwareSpec, tp: int = 1, context_tokens: int = 8192,
                    batch_size: int = 32, memory_utilization: float = 0.9,
                    block_size: int = 16,
                    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, ep: int = 1) -> dict[str, Any]:
    """Every capacity term for `model` on `tp` x `hw`, per GPU, in bytes, seconds and counts.

    The activation reserve includes the linear/SSM layers' state for max_num_seqs
    sequences, which is what the simulator's pool sets aside.
    """
    kv_token = kv_bytes_per_token(model, tp)
    kv_seq = kv_bytes_per_sequence(model, context_tokens, tp)
    check_ep(model, tp, ep)
    weights = weights_bytes(model, tp, ep)
    activations = (activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
                   + state_reserve_bytes(model, max_num_seqs, tp))
    kv_batch = kv_seq * batch_size
    blocks_per_seq = -(-context_tokens // block_size)
    kv_tokens = max_kv_tokens(model, hw, tp, memory_utilization, activations, block_size, ep)
    concurrency = max_concurrency(model, hw, context_tokens, tp, memory_utilization, block_size,
                                  activations, ep)
    crossover = memory_bound_crossover_batch(model, hw, context_tokens, tp, ep)
    # the textbook figure: the weights-only view, where attention's KV reads are ignored
    crossover_linear = memory_bound_crossover_batch(model, hw, 0, tp, ep)
    bw = hw.memory_bandwidth_bytes_per_s
    usable = hw.memory_bytes * memory_utilization
    sizing = {"context_tokens": context_tokens, "memory_utilization": memory_utilization,
              "block_size": block_size,
              "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs}
    counts = layer_counts(model)
    budget = kv_budget_bytes(model, hw, tp, memory_utilization, activations, ep)
    pool_seq = kv_token * blocks_per_seq * block_size + linear_state_bytes(model, tp)
    return {
        "model": model.name, "gpu": hw.name, "tp": tp, "context_tokens": context_tokens,
        "batch_size": batch_size, "memory_utilization": memory_utilization,
        "weight_dtype": model.weights.name, "expert_dtype": model.experts.name,
        "kv_dtype": model.kv.name, "carrier_dtype": model.carrier.name,
        "weight_bytes_per_param": model.weights.bytes_per_element,
        "expert_bytes_per_param": model.experts.bytes_per_element,
        "kv_bytes_per_element": model.kv.bytes_per_element,
        "block_size": block_size,
        "num_layers": model.num_layers, "kv_heads_per_gpu": kv_heads_per_gpu(model, tp),
        "head_dim": model.head_dim, "num_heads": model.num_heads,
        "attention": model.attention, "kv_lora_rank": model.kv_lora_rank,
        "qk_rope_head_dim": model.qk_rope_head_dim, "sliding_window": model.sliding_window,
        "full_layers": counts["full"], "sliding_layers": counts["sliding"],
        "linear_layers": counts["linear"],
        "kv_layer_bytes_per_token": layer_bytes_per_token(model, tp),
        "linear_state_bytes_per_seq": linear_state_bytes(model, tp),
        "is_moe": model.is_moe, "num_experts": model.num_experts,
        "experts_per_token": model.experts_per_token,
        "total_params": model.total_params, "active_params": model.active_params,
        "kv_bytes_per_token": kv_token,
        "kv_bytes_context_batch": kv_batch,
        "weights_bytes_per_gpu": weights,
        "ep": ep,
        # MoE: the same GPUs holding a 1/tp slice of every expert, or tp whole experts each
        "weights_bytes_per_gpu_tp": weights_bytes(model, tp),
        "weights_bytes_per_gpu_ep": (weights_bytes(model, tp, tp) if model.is_moe
                                     and not model.num_experts % tp else None),
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
        "kv_budget_bytes": budget,
        "kv_budget_tokens": kv_tokens,
        "kv_budget_blocks": kv_tokens // block_size,
        "blocks_per_seq": blocks_per_seq,
        "max_concurrency": concurrency,
        # the simulator's pool: every token in every sliding layer (no blocks freed yet)
        "pool_max_concurrency": int(budget // pool_seq),
        "batch_fits": batch_size <= concurrency,
        "decode_weights_read_bytes": weights_read_bytes(model, batch_size, tp, ep),
        "decode_experts_touched": experts_touched(model, batch_size, ep),
        "memory_bandwidth_bytes_per_s": bw,
        "decode_step_floor_s": decode_step_floor_s(model, hw, batch_size, context_tokens, tp,
                                                   ep),
        "decode_compute_per_seq_s": decode_compute_s_per_seq(model, hw, context_tokens, tp),
        "decode_kv_read_per_seq_s": kv_seq / bw,
        "crossover_batch": None if math.isinf(crossover) else crossover,
        "crossover_batch_weights_only": crossover_linear,
        "kv_to_weights_ratio": kv_batch / weights,
        "kv_bytes_per_seq": kv_seq,
        "kv_bytes_per_seq_blocks": kv_bytes_per_sequence(model, context_tokens, tp, block_size),
        "kv_seq_to_weights_ratio": kv_seq / weights,
        "kv_pool_to_weights_ratio": kv_tokens * kv_token / weights,
        "model_max_context_tokens": model.max_context_tokens,
        "context_exceeds_model": context_tokens > model.max_context_tokens,
    }
