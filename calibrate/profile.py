"""`servesim calibrate profile`: the real engine's step cycle, measured over a grid of shapes.

What a table must predict is what the simulator advances its clock by: the
engine's whole cycle between one step's start and the next, because the
engine runs steps back to back (Engine.step charges the host work between
two steps to the second, so a replay's recorded durations tile its busy
time). That cycle is scheduler.schedule + input preparation + kernels +
sampling + emitting tokens + on_step_done + the replay's recording, and the
host parts grow with the batch. So the profiler does not time kernels on
synthetic tensors and add a guess for the rest: it drives the real Engine,
with the real continuous scheduler and block manager, on crafted requests,
and times `Engine.step` + `Engine.record`, exactly the work a replay does
per step (arrivals included: the next request of a prefill point is added
during the timed step, as a replay adds arrivals).

Requests are brought into shape without running kernels (KV contents do not
change a step's time): a stand-in runner emits token 0, and the scheduler's
token budget is raised for that one untimed step, so B decodes at context C
need one bookkeeping step, not B x C tokens of prefill; a chunk on a cached
context gets its context the same way. Each point runs on a fresh scheduler
and block manager over the same model and KV tensors; `warmup` steps are
discarded (they also capture CUDA graphs) and `repeats` samples give the
median and the p10/p90 spread of the cycle (wall) and of the kernels (device
time). The simulator adds step times up, so what a table needs is a step's
mean cost, yet a rare long stall should not move it: a sample is a mean,
the reported value the median of samples. Sample j averages, over the grid's
passes (each pass visits the points in a new random order, minutes apart),
the j-th group of consecutive steps lasting about `sample_s` (at most
`max_group` steps). So a shared machine's slow phases, which last seconds
and slow every step in them (other jobs, a busy sibling core), count at
their real weight instead of the majority phase winning every median.
"""

from __future__ import annotations

import gc
import itertools
import math
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from calibrate.grid import (
    GridLimits,
    GridPoint,
    corners,
    default_grid,
    estimate_costs_s,
    plan_within,
)
from calibrate.rig import Rig, build_rig, table_metadata
from gpu_engine.engine import Engine, StepLog
from sim.core.request import Request
from sim.latency.table_format import Measurement, TableMetadata, write_measurements
from sim.metrics import RunRecorder


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What to profile; `budget_s` bounds the grid's measuring time (None = the whole grid)."""

    model: str = "tiny"
    device: str = "cpu"
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    max_model_len: int | None = None  # longest sequence profiled; None = the model's context
    budget_s: float | None = None
    warmup: int = 2
    repeats: int = 7
    sample_s: float | None = None  # a sample's length; None = 20 ms on CPU, 4 ms on CUDA
    passes: int | None = None  # times the grid is measured; None = 3 on CPU, 1 on CUDA
    max_group: int = 8  # most steps one sample averages
    threads: int | None = 1  # CPU torch threads (1 is steady on a shared machine); None = torch's
    clock: str = "wall"  # "cpu": time the CPU engine by its thread's CPU time (see ThreadCpuClock)
    dtype: str = "auto"
    seed: int = 0
    cuda_graphs: bool = True

    def problems(self) -> list[str]:
        """'field: value, allowed' for every bad setting (empty when all are fine)."""
        out = [f"{name}: must be an integer >= {low}, got {getattr(self, name)!r}"
               for name, low in (("block_size", 1), ("max_num_batched_tokens", 1),
                                 ("max_num_seqs", 1), ("warmup", 0), ("repeats", 1),
                                 ("max_group", 1),
                                 *((("passes", 1),) if self.passes is not None else ()))
               if not isinstance(getattr(self, name), int) or getattr(self, name) < low]
        if self.max_num_batched_tokens < self.max_num_seqs:
            out.append(f"max_num_batched_tokens: must be >= max_num_seqs ({self.max_num_seqs}), "
                       f"got {self.max_num_batched_tokens}")
        if self.budget_s is not None and not (math.isfinite(self.budget_s) and self.budget_s > 0):
            out.append(f"budget_s: must be a number of seconds > 0, got {self.budget_s!r}")
        if self.threads is not None and self.threads < 1:
            out.append(f"threads: must be >= 1, got {self.threads}")
        if self.device not in ("cpu", "cuda"):
            out.append(f"device: must be cpu or cuda, got {self.device!r}")
        if self.clock not in ("wall", "cpu") or (self.clock == "cpu" and self.device != "cpu"):
            out.append(f"clock: must be wall, or cpu with device cpu, got {self.clock!r} "
                       f"with device {self.device!r}")
        return out

    @property
    def steps_per_point(self) -> int:
        """Steps a point's decodes live through: each repeat may need a shaping step."""
        return 2 * (self.warmup + self.repeats * self.max_group) + 2

    @property
    def num_passes(self) -> int:
        if self.passes is not None:
            return self.passes
        return 3 if self.device == "cpu" else 1

    @property
    def sample_seconds(self) -> float:
        if self.sample_s is not None:
            return self.sample_s
        return 0.02 if self.device == "cpu" else 0.004


@dataclass(frozen=True, slots=True)
class ProfileResult:
    directory: Path
    metadata: TableMetadata
    measurements: tuple[Measurement, ...]
    grid_points: int  # in the full grid, before thinning
    skipped: tuple[GridPoint, ...]  # measured but not in the intended shape (e.g. preempted)
    measure_s: float  # time spent measuring the grid (what budget_s bounds)
    setup_s: float  # building the model, KV cache and warm-up


class _NoKernels:
    """Stands in for the ModelRunner while requests are shaped: no kernels, token 0 each."""

    def prepare(self, new_token_ids: list[list[int]], context_tokens: tuple[int, ...],
                block_tables: tuple[tuple[int, ...], ...], emits_token: tuple[bool, ...],
                min_seqs: int = 0) -> int:
        return sum(emits_token)

    def execute(self, inputs: int, sample: Callable[[torch.Tensor], torch.Tensor]
                ) -> tuple[list[int], float]:
        return [0] * inputs, 0.0


class ThreadCpuClock:
    """Engine time that only this thread's CPU time advances, plus the idle waits it skips.

    A single-threaded CPU engine's CPU time is what its steps take on a core of
    their own, so a profile and a replay timed by it agree on a shared machine
    whose other jobs would stretch wall times unpredictably. Waiting for an
    arrival jumps the clock instead of sleeping.
    """

    def __init__(self) -> None:
        self._origin = time.thread_time()
        self._idle_s = 0.0

    def now(self) -> float:
        return time.thread_time() - self._origin + self._idle_s

    def wait_until(self, t_s: float) -> None:
        self._idle_s += max(0.0, t_s - self.now())


TIMERS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


@contextmanager
def frozen_gc():  # noqa: ANN201 - a context manager
    """Move every object alive now out of the collector's reach for the block (as serving
    engines do after start-up): full collections then scan only what the block creates,
    instead of pausing a step for a traversal of every imported module's objects."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def torch_threads(threads: int | None):  # noqa: ANN201 - a context manager
    """Run with `threads` intra-op threads (None: leave torch's setting), then restore."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _PointRun:
    """One grid point on a fresh scheduler: shape the requests, then time steps."""

    def __init__(self, rig: Rig, point: GridPoint, steps_per_point: int,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.timer = timer
        self.engine: Engine = rig.fresh_engine()
        self.runner = self.engine.runner
        self.point = point
        self.recorder = RunRecorder()
        self.ids = itertools.count()
        self.decode_output = steps_per_point + 1
        self.budget = self.engine.scheduler.max_num_batched_tokens  # type: ignore[attr-defined]

    def _add(self, prompt_tokens: int, output_tokens: int) -> None:
        request = Request(next(self.ids), 0.0, prompt_tokens, output_tokens)
        if not self.engine.add_request(request):
            raise RuntimeError(f"profile: request of {prompt_tokens} + {output_tokens} tokens "
                               f"refused: {request.rejection_reason}")

    def _shaping_step(self, budget_tokens: int) -> None:
        """One untimed step without kernels under a temporary token budget."""
        scheduler = self.engine.scheduler
        scheduler.max_num_batched_tokens = budget_tokens  # type: ignore[attr-defined]
        self.engine.runner = _NoKernels()  # type: ignore[assignment]
        try:
            outcome = self.engine.step()
            if outcome is None:
                raise RuntimeError("profile: nothing to schedule while shaping a step")
            self.engine.record(*outcome, self.recorder)
        finally:
            self.engine.runner = self.runner
            scheduler.max_num_batched_tokens = self.budget  # type: ignore[attr-defined]

    def _timed_step(self, arrivals: Callable[[float], None] | None) -> tuple[float, StepLog]:
        started = self.timer()
        outcome = self.engine.step(arrivals)
        if outcome is None:
            raise RuntimeError("profile: nothing to schedule for a timed step")
        self.engine.record(*outcome, self.recorder)
        return self.timer() - started, self.engine.steps[-1]

    def run(self, warmup: int, repeats: int, sample_s: float, max_group: int
            ) -> tuple[list[float], list[float], list[StepLog]]:
        """(wall samples, device samples, step logs): each sample a group's mean, seconds."""
        p = self.point
        if p.num_decodes:  # decoders: every prompt prefilled in one step, first token out
            for context in p.decode_contexts:
                self._add(context, self.decode_output)
            self._shaping_step(sum(p.decode_contexts))
        chunk_prompt = p.chunk_context + p.chunk_tokens

        def arrive(_now_s: float) -> None:
            self._add(chunk_prompt, 1)  # the next repeat's chunk arrives during this step

        if p.chunk_tokens:
            self._add(chunk_prompt, 1)
        def step() -> tuple[float, StepLog]:
            if p.chunk_tokens and p.chunk_context:
                self._shaping_step(p.num_decodes + p.chunk_context)
            return self._timed_step(arrive if p.chunk_tokens else None)

        warm = [step()[0] for _ in range(warmup)]
        group = 1 if not warm else min(max_group, max(1, math.ceil(
            sample_s / max(float(np.median(warm)), 1e-6))))
        walls, devices, logs = [], [], []
        for _ in range(repeats):
            runs = [step() for _ in range(group)]
            walls.append(sum(w for w, _ in runs) / group)
            devices.append(sum(g.device_s for _, g in runs) / group)
            logs += [g for _, g in runs]
        return walls, devices, logs


def _matches(point: GridPoint, log: StepLog) -> bool:
    shape = log.shape
    chunks = (point.chunk_tokens,) if point.chunk_tokens else ()
    return (shape.prefill_chunk_tokens == chunks and shape.num_decodes == point.num_decodes
            and not shape.swap_out_tokens)


def to_measurement(walls_s: list[list[float]], devices_s: list[list[float]],
                   logs: list[StepLog]) -> Measurement:
    """Median and p10/p90 of the cycle (wall) and kernel (device) samples, sample j the mean
    of every pass's j-th (`walls_s[pass][j]`, seconds); the shape of the middle step."""
    walls_s = np.mean(np.array(walls_s), axis=0).tolist()
    devices_s = np.mean(np.array(devices_s), axis=0).tolist()
    shape = logs[len(logs) // 2].shape
    kind = "mixed" if shape.prefill_chunk_tokens and shape.num_decodes else (
        "prefill" if shape.prefill_chunk_tokens else "decode")
    wall = np.percentile(np.array(walls_s) * 1e3, [50, 10, 90])
    device = np.percentile(np.array(devices_s) * 1e3, [50, 10, 90])
    device = device if (device > 0).all() else np.full(3, math.nan)
    return Measurement(kind, shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                       shape.num_decodes, shape.decode_context_sum, shape.decode_context_max,
                       shape.padded_batch, 1, len(walls_s), *map(float, device),
                       *map(float, wall))


def profile_engine(settings: ProfileSettings, out_dir: str | Path,
                   show_progress: bool = True) -> ProfileResult:
    """Measure the grid (thinned to `budget_s`) and write the table's measurements + metadata."""
    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    with torch_threads(settings.threads if settings.device == "cpu" else None):
        started = time.perf_counter()
        rig = build_rig(settings)
        limits = GridLimits(settings.max_num_batched_tokens, settings.max_num_seqs,
                            rig.max_model_len, rig.pool_tokens, settings.steps_per_point)
        grid = default_grid(limits)
        setup_s = time.perf_counter() - started
        with frozen_gc():
            rows, skipped, measure_s = _measure_grid(rig, grid, settings, show_progress)
        threads = torch.get_num_threads()
    notes = (f"torch_threads={threads}; clock={settings.clock}; warmup {settings.warmup}, "
             f"repeats {settings.repeats} samples, each the mean of up to "
             f"{settings.max_group} consecutive steps lasting "
             f"~{settings.sample_seconds * 1e3:g} ms, over {settings.num_passes} pass(es); "
             f"{len(rows)} of {len(grid)} grid points in {measure_s:.0f} s"
             + (f" (budget {settings.budget_s:g} s)" if settings.budget_s else "")
             + "; wall = the engine's whole step cycle (Engine.step + Engine.record)"
             + (", in thread CPU time" if settings.clock == "cpu" else ""))
    metadata = table_metadata(rig, settings, notes)
    directory = write_measurements(out_dir, rows, metadata)
    return ProfileResult(directory, metadata, tuple(rows), len(grid), tuple(skipped),
                         measure_s, setup_s)


def _measure_grid(rig: Rig, grid: list[GridPoint], settings: ProfileSettings,
                  show_progress: bool) -> tuple[list[Measurement], list[GridPoint], float]:
    """Pass 1 measures the corners first (their times calibrate the cost estimate), then the
    rest in a seeded random order, re-thinned to the budget before each point; later passes
    re-measure pass 1's points in new random orders. Random order and passes turn a shared
    machine's slow load swings into scatter around each point, not a bias on neighbours."""
    rng = random.Random(settings.seed)
    passes = settings.num_passes
    first = corners(grid)
    pending = [i for i in range(len(grid)) if i not in set(first)]
    rng.shuffle(pending)
    spent_s: dict[int, float] = {}  # one pass of a point, seconds
    done: dict[int, int] = {}  # passes measured
    samples: dict[int, tuple[list[list[float]], list[list[float]], list[StepLog]]] = {}
    bad: set[int] = set()
    started = time.perf_counter()

    def measure(index: int) -> None:
        point_started = time.perf_counter()
        run = _PointRun(rig, grid[index], settings.steps_per_point, TIMERS[settings.clock])
        walls, devices, logs = run.run(
            settings.warmup, settings.repeats, settings.sample_seconds, settings.max_group)
        spent_s[index] = time.perf_counter() - point_started
        done[index] = done.get(index, 0) + 1
        if not all(_matches(grid[index], log) for log in logs):
            bad.add(index)
        kept = samples.setdefault(index, ([], [], []))
        kept[0].append(walls)
        kept[1].append(devices)
        kept[2].extend(logs)
        bar.update()

    def left_s() -> float:
        return math.inf if settings.budget_s is None else \
            settings.budget_s - (time.perf_counter() - started)

    with tqdm(total=len(grid) * passes, unit="shape", desc="profiling", mininterval=1.0,
              disable=not show_progress, leave=False) as bar:
        for index in first:
            measure(index)
        while pending:
            if settings.budget_s is not None:
                costs = estimate_costs_s(grid, spent_s)
                owed = sum((passes - done[i]) * costs[i] for i in done)
                pending = plan_within(sorted(pending), costs * passes, left_s() - owed)
                rng.shuffle(pending)
                bar.total = (len(done) + len(pending)) * passes
                bar.refresh()
            if pending:
                measure(pending.pop())
        for _ in range(passes - 1):
            again = sorted(done)
            rng.shuffle(again)
            for index in again:
                if spent_s[index] <= left_s():
                    measure(index)
    rows = [to_measurement(*samples[i]) for i in sorted(samples) if i not in bad]
    return rows, [grid[i] for i in sorted(bad)], time.perf_counter() - started
