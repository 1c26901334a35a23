"""One grid point on the real engine: bring requests into its shape, then time its steps.

Requests are shaped without running kernels (KV contents do not change a step's time):
a stand-in runner emits token 0, and the scheduler's token budget is raised for that
one untimed step, so B decodes at context C need one bookkeeping step, not B x C
tokens of prefill; a chunk on a cached context gets its context the same way. A timed
step is `Engine.step` + `Engine.record`: the whole cycle a replay runs per step.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from calibrate.profile.grid import GridPoint
from calibrate.profile.rig import Rig
from gpu_engine.clock import WallClock
from gpu_engine.drafters import NgramDrafter
from gpu_engine.engine import Engine, StepLog
from sim.core.request import Request
from sim.latency.table_format import Measurement, step_kind
from sim.results.record.recorder import RunRecorder


@dataclass(frozen=True, slots=True)
class _Rows:
    num_seqs: int  # what the engine logs as a step's rows
    num_emitting: int


class _NoKernels:
    """Stands in for the ModelRunner while requests are shaped: no kernels, token 0 each."""

    def prepare(self, new_token_ids: list[list[int]], context_tokens: tuple[int, ...],
                block_tables: tuple[tuple[int, ...], ...], emits_token: tuple[bool, ...],
                min_seqs: int = 0, **_: object) -> _Rows:
        return _Rows(max(min_seqs, len(new_token_ids)), sum(emits_token))

    def execute(self, inputs: _Rows, sample: Callable[[torch.Tensor], torch.Tensor]
                ) -> tuple[list[int], float]:
        return [0] * inputs.num_emitting, 0.0


class PointRun:
    """One grid point on a fresh scheduler: shape the requests, then time steps."""

    def __init__(self, rig: Rig, point: GridPoint, steps_per_point: int,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.timer = timer
        self.engine: Engine = rig.fresh_engine(point.spec_tokens)
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

    def _timed_step(self, arrivals: Callable[[float], None] | None,
                    admit: tuple[int, int] | None = None) -> tuple[float, StepLog]:
        """`Engine.step` + `Engine.record`, timed; `admit` (prompt, output tokens): a request
        admitted first, inside the timing, and the step started when it arrived."""
        started = self.timer()
        if admit is not None:
            arrived_s = self.engine.clock.now()
            self._add(*admit)
            outcome = self.engine.step(arrivals, start_s=arrived_s)
        else:
            outcome = self.engine.step(arrivals)
        if outcome is None:
            raise RuntimeError("profile: nothing to schedule for a timed step")
        self.engine.record(*outcome, self.recorder)
        return self.timer() - started, self.engine.steps[-1]

    def run(self, warmup: int, repeats: int, sample_s: float, max_group: int,
            idle_gap_s: float = 0.0) -> tuple[list[float], list[float], list[StepLog]]:
        """(wall samples, device samples, step logs): each sample a group's mean, seconds.

        `idle_gap_s` > 0: a prefill-only step is timed after the engine idled that long.
        """
        p = self.point
        if p.num_decodes:  # decoders: every prompt prefilled in one step, first token out
            for context in p.decode_contexts:  # outputs outlast every step, all drafts kept
                self._add(context, p.growth_tokens(self.decode_output - 1) + p.spec_tokens)
            self._shaping_step(sum(p.decode_contexts))
        if p.spec_tokens:  # verify k prompt-lookup drafts per decode (proposing is host work)
            self.engine.drafter = NgramDrafter()
        chunk_prompt = p.chunk_context + p.chunk_tokens
        idle_gap_s = idle_gap_s if not p.num_decodes else 0.0

        def arrive(_now_s: float) -> None:
            self._add(chunk_prompt, 1)  # the next repeat's chunk arrives during this step

        if p.chunk_tokens and not idle_gap_s:
            self._add(chunk_prompt, 1)

        def step() -> tuple[float, StepLog]:
            if not idle_gap_s:
                if p.chunk_tokens and p.chunk_context:
                    self._shaping_step(p.num_decodes + p.chunk_context)
                return self._timed_step(arrive if p.chunk_tokens else None)
            # idle as a validation replay idles (spinning: WallClock(inf)); then a prompt
            # arrives and is admitted inside the timing, as a replay's first step after idling
            # starts at its arrival. On a context (a cached prefix), the context is shaped
            # between the admission and the step, off the clock.
            WallClock(spin_s=math.inf).wait_until(idle_gap_s)
            if not p.chunk_context:
                return self._timed_step(None, admit=(chunk_prompt, 1))
            started = self.timer()
            self._add(chunk_prompt, 1)
            admitted_s = self.timer() - started
            self._shaping_step(p.chunk_context)
            step_s, log = self._timed_step(None)
            return admitted_s + step_s, log

        warm = [step()[0] for _ in range(warmup)]
        group = 1 if not warm or idle_gap_s else min(max_group, max(1, math.ceil(
            sample_s / max(float(np.median(warm)), 1e-6))))
        walls, devices, logs = [], [], []
        for _ in range(repeats):
            runs = [step() for _ in range(group)]
            walls.append(sum(w for w, _ in runs) / group)
            devices.append(sum(g.device_s for _, g in runs) / group)
            logs += [g for _, g in runs]
        return walls, devices, logs


def shape_matches(point: GridPoint, log: StepLog) -> bool:
    shape = log.shape
    chunks = (point.chunk_tokens,) if point.chunk_tokens else ()
    return (shape.prefill_chunk_tokens == chunks and shape.num_decodes == point.num_decodes
            and shape.num_spec_tokens == point.num_decodes * point.spec_tokens
            and not shape.swap_out_tokens)


def to_measurement(walls_s: list[list[float]], devices_s: list[list[float]],
                   logs: list[StepLog]) -> Measurement:
    """Median and p10/p90 of the cycle (wall) and kernel (device) samples, sample j the mean
    of every pass's j-th (`walls_s[pass][j]`, seconds); the shape of the middle step."""
    walls_s = np.mean(np.array(walls_s), axis=0).tolist()
    devices_s = np.mean(np.array(devices_s), axis=0).tolist()
    shape = logs[len(logs) // 2].shape
    query_tokens = 1 + shape.num_spec_tokens // max(1, shape.num_spec_decodes)
    wall = np.percentile(np.array(walls_s) * 1e3, [50, 10, 90])
    device = np.percentile(np.array(devices_s) * 1e3, [50, 10, 90])
    device = device if (device > 0).all() else np.full(3, math.nan)
    return Measurement(step_kind(shape), shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                       shape.num_decodes, shape.decode_context_sum, shape.decode_context_max,
                       shape.padded_batch, query_tokens, len(walls_s), *map(float, device),
                       *map(float, wall))
