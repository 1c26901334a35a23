"""`servesim engine replay`: a scenario's workload served by the real engine.

The result is the simulator's own `RunResult`, so the same summary, files and
plots come out; the engine adds `engine_steps.csv` (every step's shape with
its whole-step wall time and device time), which calibration reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from gpu_engine.engine import StepLog
from gpu_engine.sampling import SamplingParams
from gpu_engine.setup import EngineSetup, build_engine
from sim.des import ReplicaSetup
from sim.latency import LatencyModel
from sim.metrics import RunRecorder
from sim.run import RunResult, summarize
from sim.scenario import Scenario
from sim.workload import make_requests


@dataclass(frozen=True, slots=True)
class EngineRun:
    result: RunResult
    setup: EngineSetup
    steps: tuple[StepLog, ...]

    def write_outputs(self, out_dir: Path, plots: bool = True) -> list[Path]:
        written = self.result.write_outputs(out_dir, plots=plots)
        path = out_dir / "engine_steps.csv"
        steps_frame(self.steps).to_csv(path, index=False)
        return [*written, path]


def steps_frame(steps: tuple[StepLog, ...] | list[StepLog]) -> pd.DataFrame:
    """One row per step: its shape's columns, then its times in ms."""
    return pd.DataFrame({
        "start_s": [s.start_s for s in steps],
        "num_seqs": [s.num_seqs for s in steps],
        "prefill_chunk_tokens": [" ".join(map(str, s.shape.prefill_chunk_tokens))
                                 for s in steps],
        "prefill_context_tokens": [" ".join(map(str, s.shape.prefill_context_tokens))
                                   for s in steps],
        "num_decodes": [s.shape.num_decodes for s in steps],
        "decode_context_sum": [s.shape.decode_context_sum for s in steps],
        "decode_context_max": [s.shape.decode_context_max for s in steps],
        "padded_batch": [s.shape.padded_batch for s in steps],
        "duration_ms": [s.duration_s * 1e3 for s in steps],
        "wall_ms": [s.wall_s * 1e3 for s in steps],
        "device_ms": [s.device_s * 1e3 for s in steps],
    })


def replay_scenario(scenario: Scenario, base_dir: Path | None = None,
                    show_progress: bool = True, latency: LatencyModel | None = None,
                    device: str | None = None) -> EngineRun:
    """Serve the scenario's requests; `latency` set = virtual clock (no waiting on arrivals)."""
    setup = build_engine(scenario, base_dir, latency=latency, device=device)
    engine = setup.engine
    recorder = RunRecorder()
    requests = make_requests(scenario.workload, scenario.seed, base_dir)
    s = scenario.engine.sampling
    sampling = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    started = time.perf_counter()
    with tqdm(total=scenario.workload.num_requests, unit="req", delay=2.0,
              disable=not show_progress, desc="serving") as bar:
        engine.replay(requests, recorder, sampling, on_done=bar.update)
    wall_s = time.perf_counter() - started
    replica = ReplicaSetup(engine.scheduler, latency, recorder, setup.kv_manager)  # type: ignore[arg-type]
    summary = summarize(scenario, setup.budget, recorder, [replica])
    summary["replicas"] = []
    name = setup.description if latency is None else f"{setup.description}, virtual clock: " \
        f"{latency.name}"
    summary["latency_model"] = name
    summary["simulation_wall_s"] = wall_s
    result = RunResult(scenario, summary, recorder, setup.budget,
                       setup.kv_manager.num_usable_blocks, name, wall_s, (recorder,))
    return EngineRun(result, setup, tuple(engine.steps))
