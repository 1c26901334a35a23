"""Data-parallel attention with expert parallelism: what a scenario may combine it with, and
where each GPU's memory goes.

The layout (vLLM's --data-parallel-size N --tensor-parallel-size T --enable-expert-parallel,
SGLang's DP attention with EP): N attention ranks of T GPUs each, every rank with its own
scheduler and KV pool, and the routed experts dealt out whole over all N x T GPUs. So on
every GPU:
- the attention, dense MLPs, shared experts, norms, routers and vocabulary are a 1/T shard
  of one rank's copy: each rank holds the whole of them (replicated N times);
- the routed experts are num_experts / (N x T) whole experts per MoE layer: split, never
  duplicated;
- the KV is its rank's own sequences only, 1/T of their heads (MLA's latent is not split
  by heads: each rank keeps it whole for its own sequences, which is why DP attention
  pays for MLA models, whose latent TP would copy onto every GPU).

Why a module of its own: the scenario's checks (sim.config.scenario), the replica's KV
budget (sim.assemble) and the capacity sheet (sim.config.capacity) read the same split.
"""

from __future__ import annotations

from typing import Any

from sim.config.specs import ModelSpec, check_ep, check_tp, params_by_part, part_bytes


def check_data_parallel(scenario: Any) -> None:
    """Raise ValueError naming the field when a scenario asks data-parallel ranks for what
    the lockstep group does not model (the scenario's hardware.data_parallel > 1)."""
    dp = scenario.hardware.data_parallel
    if scenario.scheduler.policy != "continuous":
        raise ValueError(f"scheduler.policy: data-parallel ranks (hardware.data_parallel "
                         f"{dp}) each run vLLM's continuous scheduler, got "
                         f"{scenario.scheduler.policy!r}; use continuous")
    if scenario.replicas != 1:
        raise ValueError(f"replicas: a fleet of data-parallel groups is not modelled; with "
                         f"hardware.data_parallel {dp} use replicas 1 (got "
                         f"{scenario.replicas})")
    if scenario.speculative.num_tokens:
        raise ValueError("speculative.num_tokens: speculative decoding on data-parallel "
                         "ranks is not modelled; set it 0 or hardware.data_parallel 1")
    if scenario.latency.model != "roofline":
        raise ValueError(f"latency.model: data-parallel ranks are priced by the roofline "
                         f"(the all-to-all and the experts per GPU), got "
                         f"{scenario.latency.model!r}; use roofline")


def check_no_dp_pools(scenario: Any) -> None:
    """Raise ValueError naming the field when a disaggregated fleet's pool would run
    data-parallel ranks: the P/D world builds plain replicas, which would drop the routed
    experts' pricing, so the combination is refused rather than mispriced."""
    pd = getattr(scenario, "disaggregation", None)
    if pd is None:
        return
    for side in ("prefill", "decode"):
        hardware = getattr(pd, side).hardware or scenario.hardware
        if hardware.data_parallel > 1:
            where = (f"disaggregation.{side}.hardware" if getattr(pd, side).hardware
                     else "hardware")
            raise ValueError(f"{where}.data_parallel: a prefill or decode pool of "
                             f"data-parallel ranks is not modelled yet (got "
                             f"{hardware.data_parallel}); use data_parallel 1 in a "
                             "disaggregated fleet (docs/moe_dp_ep.md, P/D pools)")


def memory_split(model: ModelSpec, dp: int, tp: int) -> dict[str, float]:
    """One GPU's resident weights under dp ranks x tp GPUs with the experts over all dp x tp,
    by part, in bytes: `replicated_*` are the rank's copy (a 1/tp shard each), `experts`
    its num_experts / (dp x tp) whole routed experts per MoE layer."""
    check_tp(model, tp)
    gpus = dp * tp
    check_ep(model, tp, gpus, dp)
    params = params_by_part(model, tp, model.num_experts / gpus, gpus)
    size = part_bytes(model)
    split = {f"replicated_{part}_bytes": params[part] * size[part]
             for part in ("weights", "carrier", "vocab")}
    split["experts_bytes"] = params["experts"] * size["experts"]
    split["experts_per_gpu"] = model.num_experts / gpus
    split["weights_bytes"] = sum(params[part] * size[part] for part in params)
    return split


def model_expert_bytes(model: ModelSpec) -> float:
    """Every routed expert of every MoE layer once, in expert_dtype: what the GPUs of a
    dp x tp group hold between them, whatever the split."""
    params = params_by_part(model, 1, model.num_experts)
    return params["experts"] * part_bytes(model)["experts"]

