"""What one run of a scenario produced, in either world: its summary and its recorders.

The simulator (sim.experiments.run) and the engine's replay (gpu_engine.replay)
both return one, so the same files (sim.results.files.write) and pictures
(sim.plots.run) come out of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.config.scenario import Scenario
from sim.core.kv import KVBudget
from sim.results.record.recorder import RunRecorder

if TYPE_CHECKING:
    import pandas as pd


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
    timeline: pd.DataFrame | None = None  # segments of the traced requests (sim.observe)
    # a disaggregated fleet's pools, (name, recorder of the pool's steps): timeseries_<name>.csv
    pool_recorders: tuple[tuple[str, RunRecorder], ...] = ()
