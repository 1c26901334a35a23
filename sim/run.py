"""Turn a validated scenario into live objects and simulate it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import KVBudget, KVManager, PagedBlockManager
from sim.core.schedulers import Scheduler, SchedulerSettings
from sim.core.schedulers import build_scheduler as build_policy
from sim.des import simulate
from sim.latency import LatencyModel
from sim.latency.roofline import RooflineLatency
from sim.metrics import SLO, RunRecorder
from sim.scenario import Scenario
from sim.specs import activation_reserve_bytes, kv_bytes_per_token, weights_bytes
from sim.workload import make_requests


@dataclass(frozen=True, slots=True)
class RunResult:
    scenario: Scenario
    summary: dict[str, Any]
    recorder: RunRecorder
    kv_budget: KVBudget
    num_blocks: int
    latency_name: str
    wall_s: float


def kv_budget(scenario: Scenario) -> KVBudget:
    """The memory budget terms for one replica (per GPU: tensor parallelism splits all)."""
    model, tp = scenario.model_spec, scenario.hardware.count
    dtype_bytes = scenario.kv.dtype_bytes
    return KVBudget(
        memory_bytes=scenario.hardware_spec.memory_bytes,
        memory_utilization=scenario.hardware.memory_utilization,
        weights_bytes=weights_bytes(model, dtype_bytes=dtype_bytes, tp=tp),
        activation_reserve_bytes=activation_reserve_bytes(
            model, scenario.scheduler.max_num_batched_tokens, scenario.scheduler.max_num_seqs,
            dtype_bytes=dtype_bytes, tp=tp),
        kv_bytes_per_token=kv_bytes_per_token(model, dtype_bytes=dtype_bytes, tp=tp),
        block_size=scenario.kv.block_size,
    )


def build_block_manager(scenario: Scenario, budget: KVBudget) -> KVManager:
    """The KV pool of `kv.mode`; paged and contiguous get the same blocks from the same budget."""
    num_blocks = scenario.kv.num_blocks or budget.num_blocks + 1  # + the null block
    if num_blocks < 2:
        raise ValueError(
            f"no memory left for KV cache: {scenario.hardware.gpu} x{scenario.hardware.count} "
            f"at memory_utilization {scenario.hardware.memory_utilization} cannot hold "
            f"{scenario.model_spec.name}'s weights and activations; add GPUs (hardware.count) "
            "or raise hardware.memory_utilization")
    pool = ContiguousAllocator if scenario.kv_mode == "contiguous" else PagedBlockManager
    return pool(num_blocks, scenario.kv.block_size, scenario.kv.watermark)


def build_scheduler(scenario: Scenario, kv: KVManager) -> Scheduler:
    cfg = scenario.scheduler
    settings = SchedulerSettings(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        chunked_prefill=cfg.chunked_prefill,
        max_model_len=cfg.max_model_len or scenario.model_spec.max_context_tokens,
        max_output_tokens=cfg.max_output_tokens,
        batch_size=cfg.batch_size,
        max_wait_s=None if cfg.max_wait_ms is None else cfg.max_wait_ms / 1e3,
    )
    return build_policy(cfg.policy, kv, settings)


def build_latency(scenario: Scenario) -> LatencyModel:
    cfg = scenario.latency
    options: dict[str, float] = {}
    if cfg.step_overhead_ms is not None:
        options["step_overhead_s"] = cfg.step_overhead_ms / 1e3
    if cfg.compute_efficiency is not None:
        options["compute_efficiency"] = cfg.compute_efficiency
    if cfg.bandwidth_efficiency is not None:
        options["bandwidth_efficiency"] = cfg.bandwidth_efficiency
    return RooflineLatency(scenario.model_spec, scenario.hardware_spec, tp=scenario.hardware.count,
                           dtype_bytes=scenario.kv.dtype_bytes, **options)


def run_scenario(scenario: Scenario, base_dir: Path | None = None,
                 show_progress: bool = True) -> RunResult:
    budget = kv_budget(scenario)
    kv = build_block_manager(scenario, budget)
    scheduler = build_scheduler(scenario, kv)
    latency = build_latency(scenario)
    recorder = RunRecorder()
    requests = make_requests(scenario.workload, scenario.seed, base_dir)
    total = scenario.workload.num_requests
    started = time.perf_counter()
    # tqdm's delay keeps short runs silent: the bar appears only after 2 s
    with tqdm(total=total, unit="req", delay=2.0, disable=not show_progress,
              desc="simulating") as bar:
        simulate(requests, scheduler, latency, recorder, on_done=bar.update)
    wall_s = time.perf_counter() - started
    slo = None
    if scenario.slo is not None:
        slo = SLO(scenario.slo.ttft_ms, scenario.slo.tpot_ms, scenario.slo.e2el_ms)
    summary = recorder.summary(slo=slo, kv_blocks_total=kv.num_usable_blocks,
                               block_size=scenario.kv.block_size)
    summary["latency_model"] = latency.name
    summary["simulation_wall_s"] = wall_s
    return RunResult(scenario, summary, recorder, budget, kv.num_usable_blocks, latency.name,
                     wall_s)
