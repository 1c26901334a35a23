"""The capacity sheet's numbers for data-parallel attention with expert parallelism: one
GPU's memory, every term, and what the dp ranks hold together, beside pure tensor
parallelism over the same GPUs.

A pure function returns a plain dict, so `servesim capacity --dp N` (formatted by
sim.cli.capacity_dp_sheet), its JSON and the tests read the same numbers. The split is
sim.config.data_parallel's: the rank's copy of everything but the routed experts (a 1/tp
shard on each of its GPUs), num_experts / (dp x tp) whole experts, the rank's KV.
"""

from __future__ import annotations

from typing import Any

from sim.config.attention import kv_bytes_per_sequence, kv_bytes_per_token
from sim.config.costs import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    activation_reserve_bytes,
    state_reserve_bytes,
    weights_bytes,
)
from sim.config.data_parallel import memory_split, model_expert_bytes
from sim.config.hardware import HardwareSpec
from sim.config.specs import ModelSpec, check_tp
from sim.core.kv import num_kv_blocks


def _pool(model: ModelSpec, hw: HardwareSpec, tp: int, weights: float, activations: float,
          memory_utilization: float, block_size: int, context_tokens: int
          ) -> dict[str, float]:
    """One pool's per-GPU budget and what it holds (a rank's, or one TP group's)."""
    budget = max(0.0, hw.memory_bytes * memory_utilization - weights - activations)
    per_token = kv_bytes_per_token(model, tp)
    blocks = num_kv_blocks(hw.memory_bytes, memory_utilization, weights, activations,
                           per_token, block_size)
    seq = kv_bytes_per_sequence(model, context_tokens, tp, block_size)
    return {"kv_budget_bytes": budget, "kv_bytes_per_token": per_token,
            "kv_tokens": blocks * block_size, "max_concurrency": int(budget // seq)}


def dp_ep_report(model: ModelSpec, hw: HardwareSpec, dp: int, tp: int = 1,
                 context_tokens: int = 8192, memory_utilization: float = 0.9,
                 block_size: int = 16,
                 max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                 max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> dict[str, Any]:
    """Per GPU and per group, in bytes and counts: dp ranks of tp GPUs, experts over all."""
    gpus = dp * tp
    split = memory_split(model, dp, tp)
    activations = (activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
                   + state_reserve_bytes(model, max_num_seqs, tp))
    rank = _pool(model, hw, tp, split["weights_bytes"], activations, memory_utilization,
                 block_size, context_tokens)
    replicated = sum(v for k, v in split.items() if k.startswith("replicated_"))
    report: dict[str, Any] = {
        "model": model.name, "gpu": hw.name, "dp": dp, "tp": tp, "ep": gpus, "gpus": gpus,
        "attention": model.attention, "num_experts": model.num_experts,
        "context_tokens": context_tokens, "memory_utilization": memory_utilization,
        "gpu_memory_bytes": hw.memory_bytes,
        "usable_memory_bytes": hw.memory_bytes * memory_utilization,
        **split, "activation_reserve_bytes": activations,
        **{f"rank_{k}": v for k, v in rank.items()},
        "group_kv_tokens": dp * rank["kv_tokens"],
        "group_max_concurrency": dp * rank["max_concurrency"],
        # the sums the split must meet: experts split, the rest one copy per rank
        "group_weights_bytes": gpus * split["weights_bytes"],
        "group_expert_bytes": gpus * split["experts_bytes"],
        "model_expert_bytes": model_expert_bytes(model),
        "group_replicated_bytes": gpus * replicated,
    }
    try:  # the same GPUs as one tensor-parallel group, experts sliced
        check_tp(model, gpus)
    except ValueError as err:
        report["tp_only"] = {"error": str(err)}
        return report
    tp_weights = weights_bytes(model, gpus)
    tp_activations = (activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs,
                                               gpus)
                      + state_reserve_bytes(model, max_num_seqs, gpus))
    report["tp_only"] = {"tp": gpus, "weights_bytes": tp_weights,
                         "activation_reserve_bytes": tp_activations,
                         **_pool(model, hw, gpus, tp_weights, tp_activations,
                                 memory_utilization, block_size, context_tokens)}
    return report
