"""summary.json's `prediction_interval`: each ci95 figure with the model's own error added.

The interval math is sim.results.stats.prediction; this reads what it needs of a
scenario and its summary (the GPU, tp, load, what the validation runs cover) and
recomputes the block when replications replace the ci95 (sim.experiments.replicate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sim.config.scenario import Scenario
from sim.results.stats.model_error import load_description
from sim.results.stats.prediction import Domain, outside, prediction_block


def domain_of(scenario: Scenario, summary: Mapping[str, Any], latency_name: str) -> Domain:
    """The scenario's place against the validation runs: GPU, tp, load regime, features."""
    completed = summary.get("completed") or 0
    tokens = (summary.get("total_input_tokens", 0) + summary.get("total_output_tokens", 0))
    batch = summary.get("mean_batch_size")
    occupancy = (float(batch) / scenario.scheduler.max_num_seqs
                 if batch is not None and scenario.scheduler.max_num_seqs else math.nan)
    return Domain(gpu=scenario.hardware_spec.name, tp=scenario.hardware.count,
                  occupancy=occupancy, expert_parallel=scenario.hardware.expert_parallel,
                  # getattr: sections that other changes add; absent means not in use
                  data_parallel=getattr(scenario.hardware, "data_parallel", 1),
                  disaggregated=getattr(scenario, "disaggregation", None) is not None,
                  speculative_tokens=scenario.speculative.num_tokens or 0,
                  mean_context_tokens=tokens / completed if completed else 0.0,
                  scheduler_policy=scenario.scheduler.policy, latency_model=latency_name,
                  sustained=bool(summary.get("sustained", False)))


def prediction_fields(scenario: Scenario, summary: Mapping[str, Any], latency_name: str
                      ) -> dict[str, Any]:
    """{"prediction_interval": ...} for a run's summary (its ci95 and verdict included)."""
    return {"prediction_interval": prediction_block(summary.get("ci95") or {},
                                                    domain_of(scenario, summary, latency_name),
                                                    load_description())}


def refreshed(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The block again over the summary's current ci95 and verdict (replications pooled)."""
    block = summary.get("prediction_interval")
    if not block:
        return {}
    domain = Domain(**{**block["domain"], "sustained": bool(summary.get("sustained"))})
    return {"prediction_interval": prediction_block(summary.get("ci95") or {}, domain,
                                                    load_description(), block["level"])}


def static_reasons(scenario: Scenario) -> list[str]:
    """What puts `scenario` outside the validated domain before it runs (its GPU, layout,
    scheduler, latency model, speculative decoding); the context and the verdict need a run."""
    return outside(domain_of(scenario, {"sustained": True}, scenario.latency.model))
