"""A run of decode steps whose plans cannot change: what the simulator advances as one event.

While every running sequence is a plain decode, no waiting request can be
admitted and the free pool covers every block the steps take, each plan is the
last one with every context one token longer, less the sequences that finished
in it: nothing but time passes. A finisher's step just drops it (its blocks are
freed in plan order, as step by step), so a run goes on across finishes while
the queue is empty; with requests waiting it ends at the first finisher's step
(the freed seat or blocks may admit one). A scheduler describes the next such
steps as a `DecodeRun` (`ContinuousScheduler.decode_run`): segments of one
running set each, each ending with a step in which some sequences finish (but
the last). The world prices each segment in one call (`LatencyModel.decode_run_s`)
and the scheduler applies as many steps as ran (`advance_decodes`), taking and
freeing the same blocks in the same order as step by step, and returns what
ran as `RunSegment`s for the recorders. The world ends a run early at the step
an arrival lands in when that arrival could be admitted (`stops_at_arrival`),
so the plans stay those of step by step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request


class DecodeRun(NamedTuple):
    """The next `steps` plain-decode steps of an unchanging running set.

    An immutable NamedTuple rather than a frozen dataclass (built once per run and per
    applied part: ~5x cheaper), equal only to itself, as the dataclass (eq=False) was:
    `==` and hash are object's, so a comparison never reaches the numpy arrays.

    `shape` is the first step's; step s (from 0) of a segment starting at step a with
    shape S has decode context sum `S.decode_context_sum + (s - a) * S.num_decodes` and
    max `+ (s - a)` (decode_shape). `segments`: the segments after the first, each
    starting after a step in which some sequences finished, as (first step, decodes,
    decode context sum, max, padded batch) of its first step: their shapes are made
    as segment_lengths() reaches them, for an arrival ends most runs long before their
    last finisher (at 8 req/s a run describes ~22 segments, of which ~2 run).
    `kv_blocks_used[s]`: blocks in use while step s runs (a RunSegment's part: exact;
    the continuous scheduler's described run leaves it empty, only its parts are recorded).
    `num_waiting`: queued at the start; arrivals during the run only join the tail.
    `stops_at_arrival`: the queue was empty, so an arrival could be admitted: the run
    must end with the step during which the next request arrives.
    `block_size`: tokens per block (KV slots held = blocks used x block size).
    `kv_blocked`: admission stays stopped for lack of KV blocks in every step of the run
    (the scheduler's kv_blocked, which the TTFT diagnosis reads).
    """

    steps: int
    shape: StepShape
    kv_blocks_used: np.ndarray
    num_waiting: int
    stops_at_arrival: bool
    block_size: int
    kv_blocked: bool
    segments: tuple[tuple[int, int, int, int, int], ...] = ()

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def segment_lengths(self) -> Iterator[tuple[int, int, StepShape]]:
        """(first step, steps, shape) of each segment, in order, each shape made when
        reached."""
        start, shape = 0, self.shape
        for first, n, context_sum, context_max, padded in self.segments:
            yield start, first - start, shape
            start, shape = first, StepShape((), (), n, context_sum, context_max, padded)
        yield start, self.steps - start, shape


class FinishStep(NamedTuple):
    """The step that ends a segment: `plan` ran, then `finished` left (their blocks freed),
    leaving `num_running` sequences and `kv_blocks_used` blocks; `kv_slots_held` while it ran.

    A NamedTuple as DecodeRun (cheap to build), equal only to itself like it."""

    plan: StepPlan
    finished: list[Request]
    kv_blocks_used: int
    kv_slots_held: int
    num_running: int

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__


class RunSegment(NamedTuple):
    """Steps of an applied run: `run.steps` plain steps from step `start` (nobody finishes,
    `run.kv_blocks_used` exact), then `finish`, the step some sequences finished in, if any.

    A NamedTuple as DecodeRun (cheap to build), equal only to itself like it."""

    start: int
    run: DecodeRun
    finish: FinishStep | None

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__


def decode_shape(shape: StepShape, s: int) -> StepShape:
    """Step s of a run starting at `shape`: every context s tokens longer (field by field:
    shape._replace costs about twice as much, once per applied segment)."""
    return StepShape(shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                     shape.num_decodes, shape.decode_context_sum + s * shape.num_decodes,
                     shape.decode_context_max + s, shape.padded_batch, shape.swap_out_tokens,
                     shape.swap_in_tokens, shape.num_spec_decodes, shape.num_spec_tokens,
                     shape.spec_depth, shape.spec_context_sum)


def constant(steps: int, value: float | int, dtype: type = np.int64) -> np.ndarray:
    """`value` at each of a run's `steps` steps (np.full costs three times as much)."""
    out = np.empty(steps, dtype=dtype)
    out.fill(value)
    return out


def split_part(part: DecodeRun, steps: int, extra: int = 0) -> tuple[DecodeRun, DecodeRun]:
    """An applied run's part (nobody finishing, its kv_blocks_used exact) as its first
    `steps` steps and the rest; `extra`: 1 when kv_blocks_used has an entry after the last
    step (async scheduling's parts, apply_run_ahead), which the head keeps too."""
    used, rest = part.kv_blocks_used, part.steps - steps
    return (DecodeRun(steps, part.shape, used[:steps + extra], part.num_waiting,
                      part.stops_at_arrival,
                      part.block_size, part.kv_blocked),
            DecodeRun(rest, decode_shape(part.shape, steps), used[steps:], part.num_waiting,
                      part.stops_at_arrival, part.block_size, part.kv_blocked))
