"""One executed step into the recorders: the same bookkeeping for the SimPy world and the engine.

After a step, a world records the step (its plan, duration, the queue and KV
it left, the KV slots held while it ran), the speculation counters when the
replica speculates, and the requests that finished in it, into its
replica's recorder and, in a fleet, the fleet's. Both worlds call this, so a
step counts the same however its duration was found.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sim.core.decode_run import DecodeRun
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.results.record.recorder import RunRecorder


def record_step(recorders: Sequence[RunRecorder], scheduler: Scheduler, start_s: float,
                duration_s: float, plan: StepPlan, finished: Sequence[Request],
                kv_slots_held: int, result: StepResult | None = None, admitted_ahead: int = 0
                ) -> None:
    """Fold the step `plan` just applied into each recorder; `result` given: count its
    speculation (drafts, acceptances). Queue and KV figures are read from `scheduler` now,
    after the step; `kv_slots_held` was read while it ran (before finishers freed theirs).
    `admitted_ahead`: under async scheduling, the requests the next step's plan (made as this
    one started) took from the queue; they still waited while this step ran, as they
    would be counted in a synchronous engine."""
    waiting, running, used = (scheduler.num_waiting + admitted_ahead,
                              scheduler.num_running - admitted_ahead, scheduler.kv_blocks_used)
    for recorder in recorders:
        if result is not None:
            recorder.record_speculation(plan, result)
        recorder.record_step(start_s, duration_s, plan, waiting, running, used, kv_slots_held)
        for request in finished:
            recorder.record_finished(request)


def record_decode_run(recorders: Sequence[RunRecorder], run: DecodeRun, start_s: np.ndarray,
                      duration_s: np.ndarray, num_waiting: np.ndarray) -> None:
    """Fold the steps of `run` that ran (start, duration and queue after each) into each
    recorder, as record_step would step by step; no request finishes in a run."""
    for recorder in recorders:
        recorder.record_decode_run(run, start_s, duration_s, num_waiting)
