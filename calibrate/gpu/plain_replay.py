"""An engine replay from plain values, recorded to files: the half of a validation a GPU runs.

A GPU machine may lack the simulator's packages (simpy, pydantic). So a
validation is split in two:

- here, where the scenario loads: `plan_from_scenario` turns a scenario into
  a `ReplayPlan` (the model, the KV pool's size, the scheduler's settings, the
  requests with their arrivals) written as JSON (calibrate/gpu/plans/);
- on the GPU: `run_plan` builds the engine from those values alone (the same
  model, paged KV, block manager and registry scheduler as `build_engine`),
  serves the requests on the wall clock exactly as `replay_scenario` does, and
  `write_record` keeps every step (`StepLog`, shapes and times) and the
  per-request metrics as JSON;
- here again, calibrate/gpu/report.py feeds the recorded steps to the
  simulator (`calibrate.recorded.resimulate`, which must put every request
  on the engine's very timestamps) and compares the calibration table's and the
  roofline's predictions with them, as `calibrate validate` does in one go.

Floats go through JSON as Python writes them (shortest repr), so they come
back bit for bit: the world check compares timestamps exactly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gpu_engine.clock import WallClock
from gpu_engine.devices import resolve_dtype
from gpu_engine.engine import Engine, StepLog
from gpu_engine.host import frozen_gc, steady_malloc, torch_threads
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.runner import ModelRunner
from gpu_engine.sampling import SamplingParams
from gpu_engine.weights import build_model
from sim.config.catalogue import get_model
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepShape
from sim.core.request import Request
from sim.core.schedulers import SchedulerSettings, build_scheduler
from sim.results.record.recorder import RunRecorder

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

FORMAT = 2  # 2: the scheduler's settings carry speculative_tokens and cuda_graphs


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """Everything the engine needs to serve a scenario's workload, as plain values."""

    name: str
    model: str
    seed: int
    dtype: str
    block_size: int
    num_blocks: int  # null block included, as the simulator sizes the pool
    watermark: float
    prefix_caching: bool
    policy: str
    scheduler: SchedulerSettings  # as sim.assemble makes them: CUDA-graph padding included
    sampling: SamplingParams
    requests: tuple[tuple[int, float, int, int], ...]  # (id, arrival_s, prompt, output)
    scenario: dict[str, Any]  # the raw scenario, to rebuild it where it loads

    def to_json(self) -> str:
        body = dataclasses.asdict(self)
        body["scheduler"] = self.scheduler._asdict()  # a NamedTuple: asdict keeps it a tuple
        body["format"] = FORMAT
        return json.dumps(body, indent=1) + "\n"

    @staticmethod
    def from_json(text: str) -> ReplayPlan:
        body = json.loads(text)
        if body.pop("format", None) != FORMAT:
            raise ValueError(f"replay plan: format must be {FORMAT}")
        body["scheduler"] = SchedulerSettings(**body["scheduler"])
        body["sampling"] = SamplingParams(**body["sampling"])
        body["requests"] = tuple(tuple(r) for r in body["requests"])
        return ReplayPlan(**body)

    def make_requests(self) -> list[Request]:
        return [Request(rid, arrival, prompt, output)
                for rid, arrival, prompt, output in self.requests]


def plan_from_scenario(scenario: Scenario, raw: dict[str, Any]) -> ReplayPlan:
    """The plan of `scenario` (validated from `raw`): where the scenario loads, not the GPU."""
    from sim.assemble import build_block_manager, kv_budget, scheduler_settings
    from sim.workload import make_requests

    kv = build_block_manager(scenario, kv_budget(scenario))
    if not isinstance(kv, PagedBlockManager) or scenario.kv.prefix_caching \
            or any(r.prompt_token_ids or r.prefix_block_ids
                   for r in make_requests(scenario.workload, scenario.seed)):
        raise ValueError("a replay plan holds paged KV without prefix caching and requests "
                         "given by lengths only")
    # the scenario's own device (engine.device), as the report's resimulation builds it
    # (calibrate/recorded.py), so both pad decode steps to the same CUDA-graph sizes
    settings = scheduler_settings(scenario)
    s = scenario.engine.sampling
    requests = tuple((r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)
                     for r in make_requests(scenario.workload, scenario.seed))
    return ReplayPlan(
        name=scenario.name, model=scenario.model_spec.name,
        seed=scenario.seed if scenario.engine.seed is None else scenario.engine.seed,
        dtype=scenario.engine.dtype, block_size=scenario.kv.block_size,
        num_blocks=kv.num_blocks, watermark=scenario.kv.watermark, prefix_caching=False,
        policy=scenario.scheduler.policy, scheduler=settings,
        sampling=SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p),
        requests=requests, scenario=raw)


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """What a replay on the GPU leaves: its steps, its requests' metrics, how it ran."""

    steps: tuple[StepLog, ...]
    requests: dict[str, list[Any]]  # RunRecorder.requests_frame() as columns
    info: dict[str, Any]


def build_plan_engine(plan: ReplayPlan, device: torch.device) -> Engine:
    """The engine `build_engine` would make for the plan's scenario, from the plan alone."""
    spec = get_model(plan.model)
    dtype = resolve_dtype(plan.dtype, device)
    model = build_model(spec, device, dtype, seed=plan.seed)
    cache = PagedKVCache.for_spec(spec, plan.num_blocks, plan.block_size, dtype, device)
    blocks = PagedBlockManager(plan.num_blocks, plan.block_size, plan.watermark)
    scheduler = build_scheduler(plan.policy, blocks, plan.scheduler)
    if plan.scheduler.speculative_tokens:
        raise ValueError("a replay plan with speculative decoding needs its drafter: "
                         "validate such a scenario with `calibrate validate`")
    max_len = plan.scheduler.max_model_len or spec.max_context_tokens
    runner = ModelRunner(model, cache, device, plan.scheduler.max_num_seqs,
                         math.ceil(max_len / plan.block_size), plan.scheduler.cuda_graphs)
    runner.warmup()
    return Engine(model, cache, scheduler, runner, seed=plan.seed)


def run_plan(plan: ReplayPlan, device: torch.device, threads: int | None = 1,
             on_done: Any = None) -> EngineRecord:
    """Serve the plan's requests on the wall clock, as `replay_scenario` serves a scenario;
    on a CPU with `threads` torch threads (the profile's: 1) and glibc's freed memory kept."""
    started = time.perf_counter()
    cpu = device.type == "cpu"
    malloc = "steady" if cpu and steady_malloc() else "default"
    with torch_threads(threads if cpu else None):
        engine = build_plan_engine(plan, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        setup_s = time.perf_counter() - started
        recorder = RunRecorder()
        with frozen_gc():
            engine.clock = WallClock(spin_s=math.inf)  # arrivals count from here
            engine.replay(plan.make_requests(), recorder, plan.sampling, on_done=on_done)
        used_threads = torch.get_num_threads()
    frame = recorder.requests_frame()
    info = {"engine_setup_s": setup_s, "engine_wall_s": time.perf_counter() - started - setup_s,
            "engine_steps": len(engine.steps), "cuda_graphs": engine.runner.num_graphs,
            "attention": engine.runner.backend, "torch_version": torch.__version__,
            "torch_threads": used_threads, "malloc": malloc,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    return EngineRecord(tuple(engine.steps),
                        {c: frame[c].tolist() for c in frame.columns}, info)


def write_record(record: EngineRecord, path: Path) -> None:
    steps = [{**{f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "shape"},
              "shape": s.shape._asdict()} for s in record.steps]
    path.write_text(json.dumps({"format": FORMAT, "steps": steps, "requests": record.requests,
                                "info": record.info}) + "\n")


def read_record(path: Path) -> EngineRecord:
    body = json.loads(path.read_text())
    if body.get("format") != FORMAT:
        raise ValueError(f"{path}: not an engine record of format {FORMAT}")
    steps = []
    for s in body["steps"]:
        shape = {k: tuple(v) if isinstance(v, list) else v for k, v in s.pop("shape").items()}
        s["num_emitted"] = tuple(s.get("num_emitted", ()))
        steps.append(StepLog(shape=StepShape(**shape), **s))
    return EngineRecord(tuple(steps), body["requests"], body["info"])
