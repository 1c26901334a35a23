"""Simulate a scenario with a `disaggregation` section: two pools built by sim.assemble, run
in the SimPy world's disaggregated fleet (sim.world.disaggregated), summarised once.

Each pool is the scenario with its own hardware, scheduler and kv sections where the pool
gives them; the decode pool runs without a prefix cache (the KV arrives whole). The
summary is the fleet's (every request once: TTFT from its prefill instance, TPOT and E2E
to its last token on its decode instance), a row per replica, and `disaggregation`: the
second token's gap and the transfer times (p50/p99) apart, the link's bytes and busy
time, and each pool's batch, KV and queue figures.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim.assemble import build_latency, build_replica, kv_budget
from sim.config.disaggregation import PoolConfig
from sim.config.error_text import format_errors
from sim.config.scenario import Scenario
from sim.experiments.progress import DelayedBar
from sim.latency.kv_transfer import kv_shard_bytes
from sim.results.files.run import RunResult
from sim.results.files.summary import run_summary, scenario_slo, summarize
from sim.results.record.recorder import KEEP, RunRecorder
from sim.workload import make_requests
from sim.world.disaggregated_run import percentiles_ms, simulate_disaggregated
from sim.world.replica import ReplicaSetup
from sim.world.router import build_router, router_rng

POOL_FIGURES = ("mean_batch_size", "max_num_running", "max_kv_blocks_used", "kv_blocks_total",
                "mean_kv_slots_held", "mean_queue_ms", "p99_queue_ms", "num_steps")


def pool_scenario(scenario: Scenario, pool: PoolConfig, side: str) -> Scenario:
    """The scenario one pool's instances are built from: its own sections where given,
    validated as a whole (the checks across sections hold per pool too)."""
    kv = pool.kv or scenario.kv
    if side == "decode" and kv.prefix_caching:  # the KV arrives whole: no cache, no tier
        kv = kv.model_copy(update={"prefix_caching": False, "offload_host_gib": 0.0,
                                   "offload_disk_gib": 0.0})
    data = scenario.model_dump(exclude_unset=True, exclude={"disaggregation"})
    data.update(hardware=pool.hardware or scenario.hardware,
                scheduler=pool.scheduler or scenario.scheduler, kv=kv, replicas=pool.replicas)
    try:
        pooled = Scenario.model_validate(data)
    except ValidationError as err:
        raise ValueError(format_errors(err, f"disaggregation.{side}", Scenario)) from None
    if pooled.scheduler.policy != "continuous":
        where = "scheduler" if pool.scheduler is None else f"disaggregation.{side}.scheduler"
        raise ValueError(f"{where}.policy: a disaggregated pool batches continuously (a "
                         f"request joins the decode pool mid-flight), got "
                         f"{pooled.scheduler.policy!r}; use continuous")
    return pooled


def _setups(scenario: Scenario, side: str, base_dir: Path | None, slo: Any, kept: bool
            ) -> list[ReplicaSetup]:
    budget = kv_budget(scenario)
    setups = []
    for _ in range(scenario.replicas):
        try:
            parts = build_replica(scenario, budget)
        except ValueError as err:
            raise ValueError(f"disaggregation.{side}: {err}") from None
        longest = scenario.scheduler.max_model_len or scenario.model_spec.max_context_tokens
        if parts.kv.blocks_for(longest) > parts.kv.num_usable_blocks:
            raise ValueError(
                f"disaggregation.{side}: one instance's KV pool holds "
                f"{parts.kv.num_usable_blocks * parts.kv.block_size} tokens, fewer than one "
                f"request of {longest} tokens (max_model_len); give the pool more GPUs "
                f"(disaggregation.{side}.hardware.count) or a lower scheduler.max_model_len")
        setups.append(ReplicaSetup(parts.scheduler, build_latency(scenario, base_dir),
                                   RunRecorder(rows=KEEP if kept else None, slo=slo), parts.kv,
                                   fast_forward=False, links=parts.links))
    return setups


def run_disaggregated(scenario: Scenario, base_dir: Path | None = None,
                      show_progress: bool = True, keep_rows: bool = True) -> RunResult:
    """Simulate the scenario's disaggregated fleet (scenario.disaggregation must be set)."""
    dis = scenario.disaggregation
    if dis is None:
        raise ValueError("run_disaggregated needs a scenario with a disaggregation section")
    if scenario.speculative.num_tokens:
        raise ValueError("speculative.num_tokens: not simulated with disaggregation yet; "
                         "set it to 0 or drop the disaggregation section")
    slo = scenario_slo(scenario)
    sides = {side: pool_scenario(scenario, pool, side)
             for side, pool in (("prefill", dis.prefill), ("decode", dis.decode))}
    pools = {side: _setups(s, side, base_dir, slo, keep_rows) for side, s in sides.items()}
    recorder = RunRecorder(rows=KEEP if keep_rows else None, slo=slo)
    pool_recorders = (RunRecorder(rows=None, slo=slo), RunRecorder(rows=None, slo=slo))
    prefill = sides["prefill"]
    shard_per_token = kv_shard_bytes(prefill.model_spec, 1, prefill.hardware.count)
    frontend = scenario.frontend.value()
    started = time.perf_counter()
    try:
        with DelayedBar(scenario.workload.num_requests, "simulating", "req",
                        enabled=show_progress) as bar:
            _end_s, stats = simulate_disaggregated(
                make_requests(scenario.workload, scenario.seed, base_dir), pools["prefill"],
                pools["decode"], build_router(dis.prefill_router or scenario.router.policy,
                                              scenario.router.load_limit),
                build_router(dis.decode_router, scenario.router.load_limit),
                router_rng(scenario.seed), dis.link_value, recorder, pool_recorders,
                shard_per_token, prefill.model_spec.num_layers, dis.layerwise,
                on_done=bar.update, frontend=frontend)
    finally:
        recorder.close()
    wall_s = time.perf_counter() - started
    everyone = pools["prefill"] + pools["decode"]
    decode = sides["decode"]
    budget = kv_budget(decode)
    summary = run_summary(decode, budget, recorder, everyone, everyone[0].latency.name,
                          wall_s, [s.recorder for s in everyone], frontend)
    per_pool = {}
    for (side, pool_scn), rec in zip(sides.items(), pool_recorders, strict=True):
        figures = summarize(pool_scn, kv_budget(pool_scn), rec, pools[side])
        per_pool[side] = {"replicas": pool_scn.replicas, "gpus": pool_scn.replicas
                          * pool_scn.hardware.count,
                          **{k: figures.get(k) for k in POOL_FIGURES}}
    # a decode instance's queue is its own (landing -> admission), not the request's prefill
    queued = percentiles_ms(stats.decode_queue_s)
    per_pool["decode"].update(mean_queue_ms=queued["mean"], p99_queue_ms=queued["p99"])
    gap, transfer = percentiles_ms(stats.second_token_gap_s), percentiles_ms(stats.transfer_s)
    wait = percentiles_ms(stats.reservation_wait_s)
    summary["disaggregation"] = {
        "link": dis.link_value.kind, "layerwise": dis.layerwise,
        "gpus": sum(p["gpus"] for p in per_pool.values()),
        **{f"{stat}_second_token_gap_ms": gap[stat] for stat in ("mean", "p50", "p99")},
        **{f"{stat}_kv_transfer_ms": transfer[stat] for stat in ("mean", "p50", "p99")},
        **{f"{stat}_decode_reservation_wait_ms": wait[stat] for stat in ("mean", "p50", "p99")},
        "num_transfers": len(stats.transfer_s),
        "kv_transfer_bytes": stats.shard_bytes * prefill.hardware.count,
        "link_busy_s": stats.link_busy_s, "max_transfers_in_flight": stats.max_in_flight,
        "pools": per_pool, "validated": False}
    return RunResult(scenario, summary, recorder, budget, everyone[-1].kv.num_usable_blocks,
                     everyone[0].latency.name, wall_s, tuple(s.recorder for s in everyone),
                     pool_recorders=tuple(zip(sides, pool_recorders, strict=True)))
