"""Turn a validated scenario into live objects and simulate it."""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import KVBudget, KVManager, PagedBlockManager
from sim.core.schedulers import Scheduler, SchedulerSettings
from sim.core.schedulers import build_scheduler as build_policy
from sim.des import ReplicaSetup, simulate_fleet
from sim.diagnose import collect, observe
from sim.fleet import replica_rows, write_fleet_outputs
from sim.latency import LatencyModel
from sim.latency.draft import with_draft
from sim.latency.roofline import RooflineLatency
from sim.latency.table_format import TableError, open_table_latency
from sim.metrics import SLO, RunRecorder
from sim.router import build_router, router_rng
from sim.scenario import Scenario
from sim.specs import activation_reserve_bytes, kv_bytes_per_token, weights_bytes
from sim.speculative import build_speculation, draft_memory_bytes
from sim.trace import choose_requests, write_timeline
from sim.workload import make_requests


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run: the fleet summary (with `replicas`, a row per replica) and its recorders.

    `recorder` holds every request and step of the fleet; `replica_recorders`
    holds each replica's share (one replica: the fleet recorder itself).
    `kv_budget` and `num_blocks` are per replica.
    """

    scenario: Scenario
    summary: dict[str, Any]
    recorder: RunRecorder
    kv_budget: KVBudget
    num_blocks: int
    latency_name: str
    wall_s: float
    replica_recorders: tuple[RunRecorder, ...] = ()
    timeline: pd.DataFrame | None = None  # segments of the traced requests (sim.trace)

    def write_outputs(self, out_dir: Path, plots: bool = True) -> list[Path]:
        """The fleet's files, plus replicas.csv and load_balance.png for a fleet."""
        written = self.recorder.write_outputs(out_dir, self.summary, plots=plots)
        rows = self.summary.get("replicas", [])
        written += write_fleet_outputs(out_dir, self.replica_recorders, rows, plots)
        if self.timeline is not None:
            written += write_timeline(self.timeline, out_dir, plots)
        return written


def kv_budget(scenario: Scenario) -> KVBudget:
    """The memory budget terms for one replica (per GPU: tensor parallelism splits all).

    A speculative draft model adds its weights, and its KV to every token's bytes.
    """
    model, tp = scenario.model_spec, scenario.hardware.count
    dtype_bytes = scenario.kv.dtype_bytes
    draft_weights, draft_kv = draft_memory_bytes(scenario)
    return KVBudget(
        memory_bytes=scenario.hardware_spec.memory_bytes,
        memory_utilization=scenario.hardware.memory_utilization,
        weights_bytes=weights_bytes(model, dtype_bytes=dtype_bytes, tp=tp) + draft_weights,
        activation_reserve_bytes=activation_reserve_bytes(
            model, scenario.scheduler.max_num_batched_tokens, scenario.scheduler.max_num_seqs,
            dtype_bytes=dtype_bytes, tp=tp),
        kv_bytes_per_token=kv_bytes_per_token(model, dtype_bytes=dtype_bytes, tp=tp) + draft_kv,
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
    kv = scenario.kv
    if scenario.kv_mode == "contiguous":
        return ContiguousAllocator(num_blocks, kv.block_size, kv.watermark)
    # the host pool holds every GPU's shard of a swapped block
    block_bytes = budget.kv_bytes_per_token * scenario.hardware.count * kv.block_size
    host_blocks = int(kv.host_swap_gib * 2**30 // block_bytes)
    return PagedBlockManager(num_blocks, kv.block_size, kv.watermark,
                             enable_prefix_cache=kv.prefix_caching, host_swap_blocks=host_blocks)


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
        preemption=cfg.preemption,
        scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
    )
    scheduler = build_policy(cfg.policy, kv, settings)
    if scenario.speculative.num_tokens:  # validated: continuous batching only
        scheduler.speculative_tokens = scenario.speculative.num_tokens  # type: ignore[attr-defined]
        scheduler.speculative_method = (  # type: ignore[attr-defined]
            "ngram" if scenario.speculative.draft_spec is None else "draft_model")
    return scheduler


def build_latency(scenario: Scenario, base_dir: Path | None = None) -> LatencyModel:
    """The scenario's latency model; a table's path is relative to `base_dir` (the scenario's)."""
    cfg = scenario.latency
    if cfg.model == "table" and cfg.path is not None:
        model, tp = scenario.model_spec, scenario.hardware.count
        # swaps cross the scenario GPU's host link, as in the roofline model
        swap_s_per_token = (kv_bytes_per_token(model, dtype_bytes=scenario.kv.dtype_bytes, tp=tp)
                            / scenario.hardware_spec.host_link_bandwidth_bytes_per_s)
        try:
            return open_table_latency((base_dir or Path.cwd()) / cfg.path, model,
                                      scenario.kv.block_size, tp, swap_s_per_token)
        except TableError as err:
            raise TableError(f"latency.path: {err}") from None
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
                 show_progress: bool = True, timeline: int = 0) -> RunResult:
    """Simulate `scenario.replicas` identical replicas behind its router.

    Each replica gets its own block manager, scheduler and latency model from
    the builders above; one replica's recorder is the fleet's, so a single
    replica records exactly as before. Every replica diagnoses its requests' TTFT
    (sim.diagnose); `timeline` > 0 also traces that many requests, spread over the run.
    """
    budget = kv_budget(scenario)
    recorder = RunRecorder()
    setups = []
    for _ in range(scenario.replicas):
        kv = build_block_manager(scenario, budget)
        latency_model = with_draft(scenario, build_latency(scenario, base_dir))
        setups.append(ReplicaSetup(build_scheduler(scenario, kv), latency_model,
                                   recorder if scenario.replicas == 1 else RunRecorder(), kv,
                                   build_speculation(scenario)))
    traced = choose_requests(array("q", (r.request_id for r in make_requests(
        scenario.workload, scenario.seed, base_dir))), timeline) if timeline else frozenset()
    setups = observe(setups, traced)
    latency = setups[0].latency
    router = build_router(scenario.router.policy, scenario.router.load_limit)
    requests = make_requests(scenario.workload, scenario.seed, base_dir)
    total = scenario.workload.num_requests
    started = time.perf_counter()
    # tqdm's delay keeps short runs silent: the bar appears only after 2 s
    with tqdm(total=total, unit="req", delay=2.0, disable=not show_progress,
              desc="simulating") as bar:
        simulate_fleet(requests, setups, router, router_rng(scenario.seed), recorder,
                       on_done=bar.update)
    wall_s = time.perf_counter() - started
    timeline_frame = collect(setups, recorder)
    summary = summarize(scenario, budget, recorder, setups)
    # one replica: its row is the fleet summary (same recorder), no second summary
    parts = [summarize(scenario, budget, s.recorder, [s]) for s in setups] if len(
        setups) > 1 else [summary]
    summary["replicas"] = replica_rows(parts, summary)
    summary["latency_model"] = latency.name
    summary["simulation_wall_s"] = wall_s
    num_blocks = setups[0].kv.num_usable_blocks
    return RunResult(scenario, summary, recorder, budget, num_blocks, latency.name,
                     wall_s, tuple(s.recorder for s in setups), timeline_frame)


def summarize(scenario: Scenario, budget: KVBudget, recorder: RunRecorder,
              setups: Sequence[ReplicaSetup]) -> dict[str, Any]:
    """`recorder`'s summary, with pool and scheduler counters summed over `setups`.

    The fleet passes every replica; a replica's own row passes just its own.
    KV pool figures are per replica (all replicas are identical).
    """
    slo = None
    if scenario.slo is not None:
        slo = SLO(scenario.slo.ttft_ms, scenario.slo.tpot_ms, scenario.slo.e2el_ms)
    kv = setups[0].kv
    summary = recorder.summary(
        slo=slo, kv_blocks_total=kv.num_usable_blocks, block_size=scenario.kv.block_size,
        prefix_caching=scenario.kv.prefix_caching,
        cache_evictions=sum(s.kv.num_evictions for s in setups),
        recomputed_tokens=sum(getattr(s.scheduler, "num_recomputed_tokens", 0) for s in setups),
        kv_bytes_per_token=budget.kv_bytes_per_token * scenario.hardware.count)
    summary["scheduler_policy"] = scenario.scheduler.policy  # `servesim explain` words by it
    if scenario.speculative.num_tokens:
        summary["speculative_tokens"] = scenario.speculative.num_tokens
    return summary
