"""A scenario becomes the parts of a replica: its KV budget and pool, its scheduler, its
latency model. No SimPy and no torch: the simulator (sim.experiments.run), the engine
(gpu_engine.setup) and calibration all build their replicas here, so the two worlds get
the same number of blocks and the same scheduling code from the same scenario; only
how a step's duration is found differs (predicted there, measured on the engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from sim.config.catalogue import link_from_fields
from sim.config.costs import (
    activation_reserve_bytes,
    kv_bytes_per_token,
    state_reserve_bytes,
    weights_bytes,
)
from sim.config.link import Link
from sim.config.scenario import Scenario
from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import KVBudget, KVManager, PagedBlockManager
from sim.core.schedulers import Scheduler, SchedulerSettings, resolve_async_scheduling
from sim.core.schedulers import build_scheduler as build_policy
from sim.latency import LatencyModel
from sim.latency.fixed import FixedLatency
from sim.latency.moe_dp_ep import DPEPGroupLatency
from sim.latency.roofline import RooflineLatency
from sim.latency.roofline_fits import HOST_SERIAL_SHARE


class ReplicaParts(NamedTuple):
    """One replica's KV pool, the scheduler that allocates from it, and the links its KV
    moves over, by the name a KVTransfer gives (`replica_links`).

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    kv: KVManager
    scheduler: Scheduler
    links: Mapping[str, Link] = {}


def kv_budget(scenario: Scenario) -> KVBudget:
    """The memory budget terms for one replica (per GPU: tensor parallelism splits all).

    A speculative draft model adds its weights, and its KV to every token's bytes. Each
    token costs its KV in every full and sliding layer (blocks leaving a sliding window
    are not freed yet); linear/SSM layers' constant state is set aside for max_num_seqs
    sequences beside the activations.
    """
    hw, cfg = scenario.hardware, scenario.scheduler
    model, tp = scenario.model_spec, hw.tensor_parallel  # data parallel: one rank's GPUs
    draft_weights, draft_kv = draft_memory_bytes(scenario)
    return KVBudget(
        memory_bytes=scenario.hardware_spec.memory_bytes,
        memory_utilization=scenario.hardware.memory_utilization,
        weights_bytes=weights_bytes(model, tp=tp, ep=hw.expert_parallel, dp=hw.data_parallel)
        + draft_weights,
        activation_reserve_bytes=(
            activation_reserve_bytes(model, cfg.max_num_batched_tokens, cfg.max_num_seqs, tp=tp)
            + state_reserve_bytes(model, cfg.max_num_seqs, tp)),
        kv_bytes_per_token=kv_bytes_per_token(model, tp=tp) + draft_kv,
        block_size=scenario.kv.block_size,
    )


def draft_memory_bytes(scenario: Scenario) -> tuple[float, float]:
    """Per GPU: the draft model's weights and its KV bytes per token (0, 0 for n-gram).

    The draft keeps KV for every token the target does, in the same blocks.
    """
    draft = scenario.speculative.draft_spec
    if draft is None or not scenario.speculative.num_tokens:
        return 0.0, 0.0
    tp = scenario.hardware.count
    return weights_bytes(draft, tp=tp), kv_bytes_per_token(draft, tp=tp)


def build_block_manager(scenario: Scenario, budget: KVBudget) -> KVManager:
    """The KV pool of `kv.mode`; paged and contiguous get the same blocks from the same budget."""
    num_blocks = scenario.kv.num_blocks or budget.num_blocks + 1  # + the null block
    if num_blocks < 2:
        raise ValueError(
            f"no memory left for KV cache: {scenario.hardware.gpu} x{scenario.hardware.count} "
            f"at memory_utilization {scenario.hardware.memory_utilization} cannot hold "
            f"{scenario.model_spec.name}'s weights and activations; add GPUs (hardware.count) "
            "or raise hardware.memory_utilization")
    kv = scenario.kv
    if scenario.kv_mode == "contiguous":
        return ContiguousAllocator(num_blocks, kv.block_size, kv.watermark)
    # the host pool holds every GPU's shard of a swapped block
    block_bytes = budget.kv_bytes_per_token * scenario.hardware.tensor_parallel * kv.block_size
    host_blocks = int(kv.host_swap_gib * 2**30 // block_bytes)
    offload_blocks = int(kv.offload_host_gib * 2**30 // block_bytes)
    if kv.offload_host_gib and not offload_blocks:
        raise ValueError(f"kv.offload_host_gib: {kv.offload_host_gib} GiB holds no whole KV "
                         f"block of {block_bytes:.0f} bytes; give at least "
                         f"{block_bytes / 2**30:.3g} GiB, or 0 for no offload tier")
    if offload_blocks and not kv.prefix_caching:
        raise ValueError("kv.offload_host_gib: the offload tier holds the prefix cache's "
                         "evicted blocks; set kv.prefix_caching: true, or 0 GiB")
    disk_blocks = offload_disk_blocks(scenario, block_bytes, offload_blocks)
    return PagedBlockManager(num_blocks, kv.block_size, kv.watermark,
                             enable_prefix_cache=kv.prefix_caching, host_swap_blocks=host_blocks,
                             offload_blocks=offload_blocks, offload_disk_blocks=disk_blocks,
                             block_shard_bytes=budget.kv_bytes_per_token * kv.block_size,
                             offload_async=kv.offload_load == "async")


def replica_links(scenario: Scenario) -> dict[str, Link]:
    """The links a replica's KV moves cross, by the name its KVTransfers give: "host" (the
    GPU's host link: the host offload tier) and "disk" (kv.offload_disk_link)."""
    return {"host": scenario.hardware_spec.host_link,
            "disk": link_from_fields(scenario.kv.offload_disk_link)}


def offload_disk_blocks(scenario: Scenario, block_bytes: float, host_blocks: int) -> int:
    """The disk tier's blocks (kv.offload_disk_gib); errors name the field."""
    gib = scenario.kv.offload_disk_gib
    blocks = int(gib * 2**30 // block_bytes)
    if gib and not blocks:
        raise ValueError(f"kv.offload_disk_gib: {gib} GiB holds no whole KV block of "
                         f"{block_bytes:.0f} bytes; give at least {block_bytes / 2**30:.3g} "
                         f"GiB, or 0 for no disk tier")
    if blocks and not host_blocks:
        raise ValueError("kv.offload_disk_gib: the disk tier sits below the host tier; set "
                         "kv.offload_host_gib > 0 as well, or 0 GiB of disk")
    return blocks


def scheduler_settings(scenario: Scenario, device: str | None = None) -> SchedulerSettings:
    """The scenario's scheduler settings; `device` ("cpu" or "cuda") is where the engine runs
    (None: the scenario's engine.device), which decides whether decode steps are padded to
    CUDA-graph batch sizes (engine.cuda_graphs)."""
    cfg = scenario.scheduler
    return SchedulerSettings(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        chunked_prefill=cfg.chunked_prefill,
        max_model_len=cfg.max_model_len or scenario.model_spec.max_context_tokens,
        max_output_tokens=cfg.max_output_tokens,
        batch_size=cfg.batch_size,
        max_wait_s=None if cfg.max_wait_ms is None else cfg.max_wait_ms / 1e3,
        preemption=cfg.preemption,
        speculative_tokens=scenario.speculative.num_tokens,  # validated: continuous only
        speculative_method="ngram" if scenario.speculative.draft_spec is None else "draft_model",
        scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
        cuda_graphs=scenario.engine.uses_cuda_graphs(device),
        async_scheduling=is_async(scenario),
    )


def synchronous(scenario: Scenario) -> Scenario:
    """`scenario` with synchronous scheduling: for the worlds that call the scheduler one step
    at a time (the real engine's replay, `servesim serve`'s loop), so that the latency model
    prices the host time serially, as those worlds run it."""
    return scenario.model_copy(update={"scheduler": scenario.scheduler.model_copy(
        update={"async_scheduling": False})})


def is_async(scenario: Scenario) -> bool:
    """Whether the scenario's scheduler plans ahead (vLLM's async scheduling, as resolved)."""
    cfg = scenario.scheduler
    return resolve_async_scheduling(
        cfg.async_scheduling, cfg.policy, cfg.preemption, scenario.speculative.num_tokens,
        "ngram" if scenario.speculative.draft_spec is None else "draft_model")


def build_scheduler(scenario: Scenario, kv: KVManager, device: str | None = None) -> Scheduler:
    """The scenario's policy over `kv` (`device`: see scheduler_settings)."""
    return build_policy(scenario.scheduler.policy, kv, scheduler_settings(scenario, device))


def build_replica(scenario: Scenario, budget: KVBudget, device: str | None = None
                  ) -> ReplicaParts:
    """A fresh pool from `budget` and a scheduler over it: every world's replica (`device`:
    see build_scheduler)."""
    kv = build_block_manager(scenario, budget)
    return ReplicaParts(kv, build_scheduler(scenario, kv, device), replica_links(scenario))


def build_latency(scenario: Scenario, base_dir: Path | None = None) -> LatencyModel:
    """The scenario's latency model; a table's path is relative to `base_dir` (the scenario's).

    Under async scheduling (`is_async`) the roofline overlaps most host time with the GPU
    (RooflineLatency.host_serial_share). A table keeps its steps as measured: the engine that
    measured them is synchronous."""
    cfg = scenario.latency
    if cfg.model == "fixed" and cfg.step_ms is not None:
        return FixedLatency(cfg.step_ms / 1e3)
    if cfg.model == "table" and cfg.path is not None:
        from sim.latency.table_files import open_table_latency  # a table's reader, for tables
        from sim.latency.table_format import TableError

        try:
            return open_table_latency((base_dir or Path.cwd()) / cfg.path, scenario.model_spec,
                                      scenario.kv.block_size, scenario.hardware.count,
                                      cfg.step_overhead_ms, cfg.seq_overhead_ms)
        except TableError as err:
            raise TableError(f"latency.path: {err}") from None
    options: dict[str, float] = {}
    if cfg.step_overhead_ms is not None:
        options["step_overhead_s"] = cfg.step_overhead_ms / 1e3
    if cfg.seq_overhead_ms is not None:
        options["seq_overhead_s"] = cfg.seq_overhead_ms / 1e3
    if cfg.compute_efficiency is not None:
        options["compute_efficiency"] = cfg.compute_efficiency
    if cfg.bandwidth_efficiency is not None:
        options["bandwidth_efficiency"] = cfg.bandwidth_efficiency
    if is_async(scenario):
        options["host_serial_share"] = (HOST_SERIAL_SHARE if cfg.host_serial_share is None
                                        else cfg.host_serial_share)
    hw = scenario.hardware
    return RooflineLatency(scenario.model_spec, scenario.hardware_spec, tp=hw.tensor_parallel,
                           ep=hw.expert_parallel, dp=hw.data_parallel, **options)


def build_group_latency(scenario: Scenario) -> DPEPGroupLatency:
    """Data-parallel ranks in lockstep (hardware.data_parallel > 1): one rank's roofline
    (build_latency) and the all-to-all over the GPUs' link (hardware.link, else the GPU's)."""
    rank = build_latency(synchronous(scenario))  # the group overlaps the host itself
    if not isinstance(rank, RooflineLatency):  # the scenario's checks allow only the roofline
        raise ValueError("latency.model: data-parallel ranks need the roofline")
    share = 1.0
    if is_async(scenario):
        configured = scenario.latency.host_serial_share
        share = HOST_SERIAL_SHARE if configured is None else configured
    return DPEPGroupLatency(rank, scenario.hardware_spec.link, share)
