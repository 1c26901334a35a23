"""Independent replications of one scenario: the same deployment and workload, other seeds.

`servesim run --replications N` runs replication 0 at the scenario's own seed
(so N = 1 is exactly a plain run) and replications 1..N-1 at seeds derived
from it (numpy's SeedSequence of [seed, i]: deterministic, well spread, never
colliding with a neighbour seed's replications), in parallel on the sweep's
backend. Replication 0 writes the files; the summary's ci95 and sustained then
come from all N (sim.results.files.steady.pool_replications).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.config.scenario import Scenario
from sim.experiments.run import run_scenario
from sim.experiments.sweep import Backend, SweepError, Task, open_backend
from sim.results.files.predicted import refreshed
from sim.results.files.report import jsonable
from sim.results.files.run import RunResult
from sim.results.files.steady import pool_replications

MAX_REPLICATIONS = 1000


def replication_seeds(seed: int, count: int) -> list[int]:
    """The scenario's seed, then count - 1 seeds derived from it."""
    derived = [int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint32)[0])
               for i in range(1, count)]
    return [seed, *derived]


def replicate(scenario: Scenario, base_dir: Path | None, count: int,
              backend: Backend | None = None, show_progress: bool = True,
              requests_csv: Path | None = None) -> tuple[RunResult, dict[str, Any]]:
    """Replication 0's result (its summary pooled over all `count`) and the pooled block.

    `requests_csv`: replication 0 streams its rows there, as a plain run does; the
    others keep none (their summaries are all the pooling reads)."""
    if not 1 <= count <= MAX_REPLICATIONS:
        raise SweepError(f"--replications: must be 1..{MAX_REPLICATIONS}, got {count}")
    seeds = replication_seeds(scenario.seed, count)
    first = run_scenario(scenario, base_dir, show_progress=show_progress,
                         requests_csv=requests_csv)
    if count == 1:
        return first, {}
    tasks = [Task(scenario.model_copy(update={"seed": s}), base_dir or Path.cwd())
             for s in seeds[1:]]
    with open_backend(backend or Backend()) as runner:
        others = runner.run(tasks)
    errors = [r["error"] for r in others if "error" in r]
    if errors:
        raise ValueError(errors[0])
    summaries = [jsonable(first.summary), *others]
    pooled = pool_replications(summaries, seeds)
    pooled["replication_runs"] = [
        {"seed": seed, "sustained": s.get("sustained"), "window": s.get("window"),
         **{k: (s.get("ci95", {}).get(k) or {}).get("estimate")
            for k in ("request_throughput", "request_goodput", "slo_attainment",
                      "p99_ttft_ms", "p99_tpot_ms")}}
        for seed, s in zip(seeds, summaries, strict=True)]
    pooled.update(refreshed({**first.summary, **pooled}))  # over the pooled ci95
    first.summary.update(pooled)
    return first, pooled
