"""`servesim engine replay`: a scenario's workload served by the real engine.

The result is the simulator's own `RunResult` (sim.results.files.run, summarised by
sim.results.files.summary), so the same summary, files and plots come out; the engine
adds `engine_steps.csv` (every step's shape with
its whole-step wall time and device time), which calibration reads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from gpu_engine.clock import WallClock
from gpu_engine.engine import StepLog
from gpu_engine.host import ThreadCpuClock, frozen_gc, steady_malloc
from gpu_engine.runner import ModelRunner
from gpu_engine.sampling import SamplingParams
from gpu_engine.setup import EngineSetup, build_engine
from sim.config.scenario import Scenario
from sim.core.request import Request
from sim.latency import LatencyModel
from sim.results.files.run import RunResult
from sim.results.files.summary import run_summary
from sim.results.record.recorder import RunRecorder
from sim.workload import make_requests


@dataclass(frozen=True, slots=True)
class EngineRun:
    result: RunResult
    setup: EngineSetup
    steps: tuple[StepLog, ...]
    setup_s: float = 0.0  # building the engine and capturing graphs, before any arrival
    malloc: str = "default"  # "steady" where glibc was told to keep freed memory

    def write_steps(self, out_dir: Path) -> Path:
        """engine_steps.csv beside the run's result files (sim.experiments.outputs)."""
        path = Path(out_dir) / "engine_steps.csv"
        steps_frame(self.steps).to_csv(path, index=False)
        return path


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
                    device: str | None = None, clock: str = "wall") -> EngineRun:
    """Serve the scenario's requests; `latency` set = virtual clock (no waiting on arrivals).

    Served as it is profiled (gpu_engine/host.py), so a replay and a calibration
    table time the same engine: every decode graph the requests can reach is
    captured before the first arrival, the collector is frozen over the set-up's
    objects, glibc keeps freed memory on a CPU, and idle waits spin (`clock`
    wall), or engine time is the thread's CPU time (`clock` cpu, CPU only).
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock: must be wall or cpu, got {clock!r}")
    started = time.perf_counter()
    setup = build_engine(scenario, base_dir, latency=latency, device=device)
    if clock == "cpu" and setup.device.type != "cpu":
        raise ValueError(f"clock: cpu times a CPU engine only, not {setup.device.type}")
    malloc = "steady" if setup.device.type == "cpu" and steady_malloc() else "default"
    engine = setup.engine
    recorder = RunRecorder()
    requests = list(make_requests(scenario.workload, scenario.seed, base_dir))
    capture_reachable_graphs(engine.runner, requests, scenario.kv.block_size)
    if setup.device.type == "cuda":
        torch.cuda.synchronize()
    s = scenario.engine.sampling
    sampling = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    setup_s = time.perf_counter() - started
    with tqdm(total=len(requests), unit="req", delay=2.0, disable=not show_progress,
              desc="serving") as bar, frozen_gc():
        if latency is None:  # arrivals count from here, not from the build
            engine.clock = ThreadCpuClock() if clock == "cpu" else WallClock(spin_s=math.inf)
        engine.replay(requests, recorder, sampling, on_done=bar.update)
    wall_s = time.perf_counter() - started - setup_s
    name = setup.description if latency is None else f"{setup.description}, virtual clock: " \
        f"{latency.name}"
    summary = run_summary(scenario, setup.budget, recorder, [setup.replica], name, wall_s)
    result = RunResult(scenario, summary, recorder, setup.budget,
                       setup.replica.kv.num_usable_blocks, name, wall_s, (recorder,))
    return EngineRun(result, setup, tuple(engine.steps), setup_s, malloc)


def capture_reachable_graphs(runner: ModelRunner, requests: Sequence[Request],
                             block_size: int) -> int:
    """Capture every decode graph (one per batch bucket: the attention reads block tables in
    place, so no graph depends on context length) before the first arrival, so that no
    capture stalls a served step. Returns how many graphs there are."""
    if not runner.use_graphs or not requests:
        return 0
    return runner.capture_all()
