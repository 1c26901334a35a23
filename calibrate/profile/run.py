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

Requests are shaped without kernels (calibrate/profile/shaping.py), so B decodes at
context C cost one bookkeeping step, not B x C tokens of prefill. Each point
runs on a fresh scheduler and block manager over the same model and KV
tensors; `warmup` steps are discarded (they also capture CUDA graphs) and
`repeats` samples give the median and p10/p90 spread of the cycle (wall) and
of the kernels (device time). The simulator adds step times up, so a table
needs a step's mean cost, yet a rare long stall should not move it: a sample
is a mean, the reported value the median of samples. Sample j averages, over
the grid's passes (each visits the points in a new random order), the j-th
group of consecutive steps lasting about `sample_s` (at most `max_group`).
A shared machine's slow phases, which last seconds, so count at their real
weight instead of the majority phase winning every median. A prefill-only
step (nothing else running) is timed after an `idle_gap_s` wait, as serving
runs it: the first step after idling runs cache-cold.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from calibrate.profile.grid import (
    GridLimits,
    GridPoint,
    corners,
    default_grid,
    estimate_costs_s,
    plan_within,
)
from calibrate.profile.rig import Rig, build_rig, table_metadata
from calibrate.profile.settings import ProfileSettings
from calibrate.profile.shaping import PointRun, shape_matches, to_measurement
from gpu_engine.engine import StepLog
from gpu_engine.host import TIMERS, ThreadCpuClock, frozen_gc, steady_malloc, torch_threads
from sim.latency.table_files import write_measurements
from sim.latency.table_format import Measurement, TableMetadata

__all__ = ["ProfileResult", "ProfileSettings", "ThreadCpuClock", "frozen_gc", "profile_engine",
           "torch_threads"]  # ProfileSettings lives in calibrate.profile.settings


@dataclass(frozen=True, slots=True)
class ProfileResult:
    """What `profile_engine` wrote (`directory`) and how the measuring went."""

    directory: Path
    metadata: TableMetadata
    measurements: tuple[Measurement, ...]
    grid_points: int  # in the full grid, before thinning
    skipped: tuple[GridPoint, ...]  # measured but not in the intended shape (e.g. preempted)
    measure_s: float  # time spent measuring the grid (what budget_s bounds)
    setup_s: float  # building the model, KV cache and warm-up
    points_s: tuple[float, ...] = ()  # each point measurement's seconds, in the order taken
    corners: int = 0  # the first `corners` of them: measured whatever the budget


def profile_engine(settings: ProfileSettings, out_dir: str | Path, show_progress: bool = True,
                   between_passes: Callable[[int], None] | None = None) -> ProfileResult:
    """Measure the grid (thinned to `budget_s`) and write the table's measurements + metadata.

    `between_passes(k)` runs after pass k (1-based) of several, off the budget's clock: a
    replay run there is bracketed by the passes that the table averages.
    """
    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    malloc = "steady" if settings.device == "cpu" and steady_malloc() else "default"
    with torch_threads(settings.threads if settings.device == "cpu" else None):
        started = time.perf_counter()
        rig = build_rig(settings)
        limits = GridLimits(settings.max_num_batched_tokens, settings.max_num_seqs,
                            rig.max_model_len, rig.pool_tokens, settings.steps_per_point)
        grid = default_grid(limits)
        setup_s = time.perf_counter() - started
        with frozen_gc():
            rows, skipped, measure_s, points_s = _measure_grid(rig, grid, settings,
                                                               show_progress, between_passes)
        threads = torch.get_num_threads()
    idle = (f"prefill-only steps timed after a {settings.idle_gap_s * 1e3:g} ms idle wait, from "
            "their request's arrival" if settings.clock == "wall" and settings.idle_gap_s
            else "prefill-only steps timed back to back")
    notes = (f"torch_threads={threads}; clock={settings.clock}; malloc={malloc}; "
             f"warmup {settings.warmup}, "
             f"repeats {settings.repeats} samples, each the mean of up to "
             f"{settings.max_group} consecutive steps lasting "
             f"~{settings.sample_seconds * 1e3:g} ms, over {settings.num_passes} pass(es); "
             f"{idle}; "
             f"{len(rows)} of {len(grid)} grid points in {measure_s:.0f} s"
             + (f" (budget {settings.budget_s:g} s)" if settings.budget_s else "")
             + "; wall = the engine's whole step cycle (Engine.step + Engine.record)"
             + (", in thread CPU time" if settings.clock == "cpu" else ""))
    metadata = table_metadata(rig, settings, notes)
    directory = write_measurements(out_dir, rows, metadata)
    return ProfileResult(directory, metadata, tuple(rows), len(grid), tuple(skipped),
                         measure_s, setup_s, tuple(points_s), len(corners(grid)))


def _measure_grid(rig: Rig, grid: list[GridPoint], settings: ProfileSettings,
                  show_progress: bool, between_passes: Callable[[int], None] | None = None
                  ) -> tuple[list[Measurement], list[GridPoint], float, list[float]]:
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
    taken_s: list[float] = []
    started = time.perf_counter()

    def measure(index: int) -> None:
        point_started = time.perf_counter()
        run = PointRun(rig, grid[index], settings.steps_per_point, TIMERS[settings.clock])
        walls, devices, logs = run.run(
            settings.warmup, settings.repeats, settings.sample_seconds, settings.max_group,
            settings.idle_gap_s if settings.clock == "wall" else 0.0)
        spent_s[index] = time.perf_counter() - point_started
        taken_s.append(spent_s[index])
        done[index] = done.get(index, 0) + 1
        if not all(shape_matches(grid[index], log) for log in logs):
            bad.add(index)
        kept = samples.setdefault(index, ([], [], []))
        kept[0].append(walls)
        kept[1].append(devices)
        kept[2].extend(logs)
        bar.update()

    away_s = [0.0]  # spent in between_passes, off the budget

    def left_s() -> float:
        return math.inf if settings.budget_s is None else \
            settings.budget_s - (time.perf_counter() - started - away_s[0])

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
        for finished in range(1, passes):
            if between_passes is not None:
                left = time.perf_counter()
                between_passes(finished)
                away_s[0] += time.perf_counter() - left
            again = sorted(done)
            rng.shuffle(again)
            for index in again:
                if spent_s[index] <= left_s():
                    measure(index)
    rows = [to_measurement(*samples[i]) for i in sorted(samples) if i not in bad]
    measure_s = time.perf_counter() - started - away_s[0]
    return rows, [grid[i] for i in sorted(bad)], measure_s, taken_s
