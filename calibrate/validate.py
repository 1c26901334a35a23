"""`servesim calibrate validate`: one workload on the real engine and in the simulator.

The engine serves the scenario's requests on the wall clock with real
arrivals; the simulator replays the same requests (`make_requests` with the
scenario's seed) twice, with the calibration table and with the roofline
model, so the report shows both what the table gets right and what
calibration buys over the default. Per step, every shape the engine ran is
priced by both models against its measured duration (which, back to back,
is the engine's whole step cycle: what the simulator's clock advances by).

The engine runs with the table's torch thread count (recorded by `profile`),
and on CUDA every decode graph the workload can need is captured before the
first arrival, so no capture stalls a measured step.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from calibrate.profile.rig import git_commit
from calibrate.recorded import Diverged, resimulate
from gpu_engine.engine import StepLog
from gpu_engine.host import torch_threads
from gpu_engine.replay import replay_scenario
from sim.assemble import build_latency
from sim.config.loader import load_scenario
from sim.config.scenario import Scenario
from sim.config.sections import FrontendConfig, LatencyConfig
from sim.config.speculative import BetaAlphaConfig, FixedAlphaConfig
from sim.experiments.run import run_scenario
from sim.latency import LatencyModel
from sim.latency.table_files import load_table
from sim.latency.table_format import TableMetadata, step_kind
from sim.results.files.fidelity import METRICS, relative_error_pct
from sim.results.files.run import RunResult
from sim.world.speculation import alpha_for_tokens_per_step


@dataclass(frozen=True, slots=True)
class MetricComparison:
    key: str
    label: str
    unit: str
    engine: float
    table: float
    roofline: float

    @property
    def table_error_pct(self) -> float:
        return relative_error_pct(self.table, self.engine)

    @property
    def roofline_error_pct(self) -> float:
        return relative_error_pct(self.roofline, self.engine)


@dataclass(frozen=True, slots=True)
class Fidelity:
    """Engine vs simulator on one workload; `steps` prices every engine step with both models."""

    scenario: Scenario
    table_dir: Path
    metadata: TableMetadata
    metrics: tuple[MetricComparison, ...]
    engine: RunResult
    table: RunResult
    roofline: RunResult
    steps: pd.DataFrame
    info: dict[str, Any] = field(default_factory=dict)

    def metric(self, key: str) -> MetricComparison:
        for m in self.metrics:
            if m.key == key:
                return m
        raise KeyError(f"no metric {key!r}; known: {', '.join(m.key for m in self.metrics)}")


def table_threads(metadata: TableMetadata) -> int | None:
    """The torch thread count the table was profiled with (None when not recorded)."""
    found = re.search(r"torch_threads=(\d+)", metadata.notes)
    return int(found.group(1)) if found else None


def table_clock(metadata: TableMetadata) -> str:
    """The clock the table was profiled with: wall, or cpu (ThreadCpuClock)."""
    found = re.search(r"clock=(wall|cpu)\b", metadata.notes)
    return found.group(1) if found else "wall"


def steps_table(steps: Sequence[StepLog], table: LatencyModel, roofline: LatencyModel
                ) -> pd.DataFrame:
    """One row per engine step: its shape, measured times and both models' predictions (ms)."""
    rows = []
    for s in steps:
        shape = s.shape
        chunks = shape.prefill_chunk_tokens
        rows.append({
            "start_s": s.start_s,
            "kind": step_kind(shape),
            "num_seqs": s.num_seqs,
            "prefill_tokens": sum(chunks),
            "prefill_context_tokens": sum(shape.prefill_context_tokens),
            "num_decodes": shape.num_decodes,
            "decode_context_sum": shape.decode_context_sum,
            "decode_context_max": shape.decode_context_max,
            "measured_ms": s.duration_s * 1e3,
            "wall_ms": s.wall_s * 1e3,
            "device_ms": s.device_s * 1e3,
            "table_ms": table.step_time(shape) * 1e3,
            "roofline_ms": roofline.step_time(shape) * 1e3,
        })
    return pd.DataFrame(rows)


@dataclass(frozen=True, slots=True)
class EngineReplay:
    """The engine side of a validation: its run, its steps, how it ran."""

    result: RunResult
    steps: tuple[StepLog, ...]
    info: dict[str, Any]


def run_engine(scenario: Scenario, base_dir: Path | None, device: str = "cpu",
               threads: int | None = None, clock: str = "wall",
               show_progress: bool = True) -> EngineReplay:
    """Replay the scenario on the engine: `device` cpu or cuda, torch `threads` (CPU; None =
    torch's), `clock` wall or cpu (ThreadCpuClock, CPU only)."""
    if clock not in ("wall", "cpu") or (clock == "cpu" and device != "cpu"):
        raise ValueError(f"clock: must be wall, or cpu on a CPU, got {clock!r} on {device}")
    load_before = os.getloadavg()
    with torch_threads(threads if device == "cpu" else None):
        run = replay_scenario(scenario, base_dir, show_progress, device=device, clock=clock)
        used_threads = torch.get_num_threads()
    result, steps = run.result, run.steps
    info = {"torch_threads": used_threads, "clock": clock, "malloc": run.malloc,
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(), "engine_setup_s": run.setup_s,
            "engine_wall_s": result.wall_s, "engine_steps": len(steps), "commit": git_commit(),
            "torch_version": torch.__version__, "engine": result.latency_name,
            "device": device}
    return EngineReplay(result, steps, info)


def on_device(scenario: Scenario, device: str) -> Scenario:
    """The scenario as the engine ran it, its engine.device pinned to `device`: with
    `engine.cuda_graphs` null the scheduler pads decode steps on a GPU only, so the simulator
    must know where the engine ran to make the engine's plans."""
    return scenario.model_copy(update={"engine": scenario.engine.model_copy(
        update={"device": device})})


def compare(scenario: Scenario, base_dir: Path | None, table_dir: str | Path,
            replay: EngineReplay) -> Fidelity:
    """The simulator side: the same requests with the table and with the roofline model,
    each metric and each engine step compared with the engine's."""
    scenario = as_the_engine_runs(on_device(scenario, replay.info.get("device",
                                                                    scenario.engine.device)))
    table_dir = Path(table_dir).resolve()
    loaded = load_table(table_dir, scenario.model_spec, scenario.kv.block_size,
                        scenario.hardware.count)
    engine_run = replay.result
    speculation = engine_acceptance(engine_run.summary, engine_run.recorder.requests_frame())
    simulated = scenario
    if speculation:  # compare timing, not the acceptance guess: the engine's acceptance
        acceptance = acceptance_config(speculation)
        speculation["simulated_alpha_std"] = getattr(acceptance, "std", 0.0)
        simulated = simulated.model_copy(update={"speculative": scenario.speculative.model_copy(
            update={"acceptance": acceptance})})
    with_table = simulated.model_copy(update={"latency": LatencyConfig(
        model="table", path=str(table_dir))})
    with_roofline = simulated.model_copy(update={"latency": LatencyConfig()})
    table_run = run_scenario(with_table, base_dir, show_progress=False)
    roofline_run = run_scenario(with_roofline, base_dir, show_progress=False)
    metrics = tuple(MetricComparison(key, label, unit, float(engine_run.summary[key]),
                                     float(table_run.summary[key]),
                                     float(roofline_run.summary[key]))
                    for key, label, unit in METRICS)
    frame = steps_table(replay.steps, build_latency(with_table, base_dir),
                        build_latency(with_roofline, base_dir))
    info = {**replay.info, "table_model": table_run.latency_name,
            "roofline_model": roofline_run.latency_name,
            "world_check": world_check(scenario, base_dir, replay),
            "table_torch_version": loaded.metadata.torch_version,
            **({"speculation": speculation} if speculation else {})}
    return Fidelity(scenario, table_dir, loaded.metadata, metrics, engine_run, table_run,
                    roofline_run, frame, info)


def as_the_engine_runs(scenario: Scenario) -> Scenario:
    """`scenario` as the real engine serves it: synchronous scheduling (sim.core.drive) and no
    frontend (a replay has no client), so engine-side figures meet engine-side figures."""
    return scenario.model_copy(update={
        "frontend": FrontendConfig(api_server_ms=0.0, tokenize_us_per_token=0.0,
                                   detokenize_us_per_token=0.0, stream_us_per_token=0.0),
        "scheduler": scenario.scheduler.model_copy(update={"async_scheduling": False})})


def world_check(scenario: Scenario, base_dir: Path | None, replay: EngineReplay) -> str:
    """"exact" when the simulator, fed the engine's own step times, puts every request on the
    engine's very timestamps (calibrate.recorded); else what differed. Anything else a
    report shows is then the latency model's error on steps, not the world's."""
    try:
        again = resimulate(scenario, base_dir, replay.steps).requests_frame()
    except Diverged as err:
        return f"diverged: {err}"
    engine = replay.result.recorder.requests_frame()
    if again.equals(engine):
        return "exact"
    return f"differs: {len(engine)} engine requests, {len(again)} simulated"


def engine_acceptance(summary: dict[str, Any], requests: pd.DataFrame | None = None
                      ) -> dict[str, float]:
    """What an engine run's speculation measured, and the acceptance that reproduces it.

    `alpha`: the fixed alpha with the engine's pooled tokens per verify
    (sim.world.speculation's i.i.d. acceptance). `alpha_std`: the spread of its requests'
    own alphas (from each request's drafted / accepted counts in `requests`), which
    the simulator draws per request from a Beta with mean `alpha`: how much one
    request's drafts match differs a lot between requests, and that spread is what
    sets TPOT's percentiles. Empty when nothing was drafted.
    """
    drafted, accepted = summary.get("spec_draft_tokens", 0), summary.get("spec_accepted_tokens", 0)
    per_step = summary.get("mean_tokens_per_spec_step", math.nan)
    if not drafted or not math.isfinite(per_step):
        return {}
    if not accepted:
        return {"tokens_per_verify": 1.0, "acceptance_rate": 0.0, "alpha": 0.0}
    k = drafted * (per_step - 1.0) / accepted  # drafted / verifies
    per_step = min(per_step, k + 1.0)  # equal in exact arithmetic when all were accepted
    out = {"drafts_per_verify": k, "tokens_per_verify": per_step,
           "acceptance_rate": accepted / drafted,
           "alpha": alpha_for_tokens_per_step(per_step, k)}
    if requests is not None and "spec_drafted" in requests:
        own = requests[requests["spec_drafted"] > 0]
        tokens = (1.0 + own["spec_accepted"] * k / own["spec_drafted"]).clip(1.0, k + 1.0)
        alphas = [alpha_for_tokens_per_step(float(t), k) for t in tokens]
        if len(alphas) >= 2:
            out["alpha_std"] = float(np.std(alphas))
    return out


def acceptance_config(measured: dict[str, float]) -> FixedAlphaConfig | BetaAlphaConfig:
    """The simulator's acceptance for an engine's measured one: a Beta per request with the
    pooled alpha as mean and the requests' spread (kept feasible), else the fixed alpha."""
    mean, std = measured["alpha"], measured.get("alpha_std", 0.0)
    if 0.0 < mean < 1.0 and std > 0.01:
        return BetaAlphaConfig(dist="beta", mean=mean,
                               std=min(std, 0.95 * math.sqrt(mean * (1.0 - mean))))
    return FixedAlphaConfig(alpha=mean)


def validate(scenario: Scenario, base_dir: Path | None, table_dir: str | Path,
             threads: int | None = None, show_progress: bool = True,
             clock: str | None = None) -> Fidelity:
    """Engine replay, then the simulator with the table and with the roofline, compared.

    `threads` and `clock` default to the table's (as profiled).
    """
    loaded = load_table(Path(table_dir), scenario.model_spec, scenario.kv.block_size,
                        scenario.hardware.count)  # refuses a mismatch before any work
    meta = loaded.metadata
    replay = run_engine(scenario, base_dir, meta.device_kind,
                        table_threads(meta) if threads is None else threads,
                        clock or table_clock(meta), show_progress)
    return compare(scenario, base_dir, table_dir, replay)


def validate_file(path: str | Path, table_dir: str | Path, overrides: Sequence[str] = (),
                  threads: int | None = None, show_progress: bool = True,
                  clock: str | None = None) -> Fidelity:
    """`validate` on a scenario file (with `--set` overrides)."""
    scenario, base_dir = load_scenario(path, overrides)
    return validate(scenario, base_dir, table_dir, threads, show_progress, clock)
