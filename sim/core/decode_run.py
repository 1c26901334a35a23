"""A run of decode steps whose plans cannot change: what the simulator advances as one event.

While every running sequence is a plain decode, none finishes, no waiting request
can be admitted and the free pool covers every block the steps take, each plan
is the last one with every context one token longer: nothing but time passes.
A scheduler describes the next such steps as a `DecodeRun`
(`ContinuousScheduler.decode_run`), the world prices them in one call
(`LatencyModel.decode_run_s`) and the scheduler applies as many of them as ran
(`advance_decodes`), taking the same blocks in the same order as step by step.
The world ends a run early at the step an arrival lands in when that arrival
could be admitted (`stops_at_arrival`), so the plans stay those of step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.core.plan import StepShape


@dataclass(frozen=True, slots=True, eq=False)
class DecodeRun:
    """The next `steps` plain-decode steps of an unchanging running set.

    `shape` is the first step's; step s (from 0) has decode context sum
    `shape.decode_context_sum + s * shape.num_decodes` and max `+ s` (decode_shape).
    `kv_blocks_used[s]`: blocks in use while step s runs and after it (no one frees).
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


def decode_shape(shape: StepShape, s: int) -> StepShape:
    """Step s of a run starting at `shape`: every context s tokens longer."""
    return replace(shape, decode_context_sum=shape.decode_context_sum + s * shape.num_decodes,
                   decode_context_max=shape.decode_context_max + s)
