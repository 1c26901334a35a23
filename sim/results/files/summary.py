"""A run's summary: the recorder's figures with the pool and scheduler counters, and a row
per replica of a fleet.

The fleet summary (all requests pooled) is the main one; the replica rows say
how the router spread the work. Per-replica throughputs divide by the fleet's
duration, not the replica's own span, so they add up to the fleet's and an
idle-at-the-end replica is not flattered by a short span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from sim.config.frontend import Frontend
from sim.config.scenario import Scenario
from sim.core.kv import KVBudget, KVManager
from sim.core.schedulers import Scheduler
from sim.results.files.offload import offload_summary
from sim.results.files.predicted import prediction_fields
from sim.results.files.steady import steady_summary
from sim.results.record.recorder import RunRecorder
from sim.results.stats.slo import SLO

# 2: the vLLM-bench latency names are client-side (the frontend included); engine_* added
SUMMARY_SCHEMA_VERSION = 2


class Replica(Protocol):
    """What the summary reads of a replica: its pool and its scheduler."""

    @property
    def kv(self) -> KVManager: ...

    @property
    def scheduler(self) -> Scheduler: ...

# copied from each replica's own summary, in this order (absent keys are skipped)
REPLICA_FIELDS = ("completed", "rejected", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                  "p99_tpot_ms", "total_input_tokens", "prefix_hit_rate", "prefill_tokens_saved",
                  "cache_evictions", "total_preemptions", "mean_batch_size",
                  "max_kv_blocks_used", "num_steps")


def replica_row(index: int, summary: dict[str, Any], fleet_duration_s: float,
                num_requests: int) -> dict[str, Any]:
    """One replica's row: its share of the requests and its own latency, batch and KV figures."""
    routed = summary["completed"] + summary["rejected"]
    row: dict[str, Any] = {"replica": index, "requests": routed,
                           "share": routed / num_requests if num_requests else math.nan}
    row.update({k: summary[k] for k in REPLICA_FIELDS if k in summary})
    ok = fleet_duration_s > 0
    row["request_throughput"] = summary["completed"] / fleet_duration_s if ok else math.nan
    row["output_throughput"] = (summary["total_output_tokens"] / fleet_duration_s if ok
                                else math.nan)
    return row


def replica_rows(summaries: Sequence[dict[str, Any]], fleet_summary: dict[str, Any]
                 ) -> list[dict[str, Any]]:
    """A row per replica from each replica's own summary, throughputs over the fleet's span."""
    total = fleet_summary["completed"] + fleet_summary["rejected"]
    return [replica_row(i, summary, fleet_summary["duration"], total)
            for i, summary in enumerate(summaries)]


def scenario_slo(scenario: Scenario) -> SLO | None:
    """The scenario's SLO as the recorder takes it (None without one)."""
    if scenario.slo is None:
        return None
    return SLO(scenario.slo.ttft_ms, scenario.slo.tpot_ms, scenario.slo.e2el_ms)


def summarize(scenario: Scenario, budget: KVBudget, recorder: RunRecorder,
              setups: Sequence[Replica]) -> dict[str, Any]:
    """`recorder`'s summary, with pool and scheduler counters summed over `setups`.

    The fleet passes every replica; a replica's own row passes just its own.
    KV pool figures are per replica (all replicas are identical).
    """
    slo = scenario_slo(scenario)
    kv = setups[0].kv
    summary = recorder.summary(
        slo=slo, kv_blocks_total=kv.num_usable_blocks, block_size=scenario.kv.block_size,
        prefix_caching=scenario.kv.prefix_caching,
        cache_evictions=sum(s.kv.num_evictions for s in setups),
        recomputed_tokens=sum(s.scheduler.num_recomputed_tokens for s in setups),
        kv_bytes_per_token=budget.kv_bytes_per_token * scenario.hardware.tensor_parallel)
    summary["scheduler_policy"] = scenario.scheduler.policy  # `servesim explain` words by it
    if scenario.speculative.num_tokens:
        summary["speculative_tokens"] = scenario.speculative.num_tokens
    tiers = [s.kv.offload for s in setups if getattr(s.kv, "offload", None) is not None]
    if tiers:  # the prefix cache's offload tiers (kv.offload_host_gib, kv.offload_disk_gib)
        summary["kv_offload"] = offload_summary(
            tiers, budget.kv_bytes_per_token * scenario.kv.block_size,
            scenario.hardware.tensor_parallel, scenario.kv.offload_load)
    return summary


def engine_fields(summary: dict[str, Any], frontend: Frontend | None) -> dict[str, Any]:
    """The engine's own latencies beside the client's: `engine_*` (schema version 2).

    The vLLM-bench names are what a client measures (the simulator's recorded times pass
    the frontend, sim.config.frontend); the engine saw each request's TTFT and E2E shorter by
    the frontend's offset for its prompt. Means are exact (the offset is linear in the
    prompt's tokens); percentiles take the offset at the mean prompt, which is within the
    tokenizer's few us per token of the per-request one. `frontend` None: the times are
    the engine's (its replay, which runs no frontend), and both sets are equal.
    """
    completed = summary.get("completed") or 0
    mean_prompt = summary["total_input_tokens"] / completed if completed else 0.0
    offset_ms = frontend.offset_s(mean_prompt) * 1e3 if frontend is not None else 0.0
    out: dict[str, Any] = {}
    for metric in ("ttft", "e2el"):
        for stat in ("mean", "median", "p90", "p95", "p99"):
            key = f"{stat}_{metric}_ms"
            if key in summary:
                out[f"engine_{key}"] = summary[key] - offset_ms
    for stat in ("mean", "median", "p99"):
        if f"{stat}_tpot_ms" in summary:  # the offset adds to TTFT and E2E alike
            out[f"engine_{stat}_tpot_ms"] = summary[f"{stat}_tpot_ms"]
    out["frontend_offset_ms"] = offset_ms
    return out


def run_summary(scenario: Scenario, budget: KVBudget, recorder: RunRecorder,
                replicas: Sequence[Replica], latency_name: str, wall_s: float,
                replica_recorders: Sequence[RunRecorder] = (),
                frontend: Frontend | None = None) -> dict[str, Any]:
    """summary.json's content, for either world: the one place a run's summary is assembled.

    `recorder` holds the whole run; `replica_recorders` (the simulator's, one per
    replica, the fleet's own for one replica) give a row each under `replicas`,
    which stays empty without them (the engine serves one replica). Then the
    engine-side latencies (`engine_fields`; `frontend`: the one the recorded times
    passed, None for the engine's own), the latency model's name and the run's wall time.
    """
    summary = {"summary_schema_version": SUMMARY_SCHEMA_VERSION,
               **summarize(scenario, budget, recorder, replicas)}
    if len(replica_recorders) > 1:
        parts = [summarize(scenario, budget, rec, [replica])
                 for rec, replica in zip(replica_recorders, replicas, strict=True)]
    else:  # one replica: its row is the run's summary (same recorder), no second summary
        parts = [summary] * len(replica_recorders)
    summary["replicas"] = replica_rows(parts, summary)
    summary.update(steady_summary(recorder.request_batches(scenario_slo(scenario)).series(),
                                  recorder.itl_slices))
    summary.update(engine_fields(summary, frontend))
    summary.update(prediction_fields(scenario, summary, latency_name))  # noise + model error
    summary["latency_model"] = latency_name
    summary["simulation_wall_s"] = wall_s
    return summary
