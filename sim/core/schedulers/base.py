"""What every scheduler offers the two worlds (simulator and engine)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sim.core.decode_run import DecodeRun, RunSegment
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request


class Scheduler(Protocol):
    """The step contract of DESIGN.md; implementations never read a clock."""

    def add(self, request: Request, now: float) -> bool:
        """Queue a request; False (and the request marked rejected) if it can never run."""
        ...

    def schedule(self, now: float) -> StepPlan | None:
        """The next step to run, or None when nothing is runnable.

        With `async_scheduling` it may be called while one earlier plan is still
        outstanding (scheduled, its on_step_done not yet called), as vLLM's engine core
        schedules step n + 1 while step n runs; never with two outstanding.
        """
        ...

    def on_step_done(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply a finished step; returns the requests that completed in it.

        With `async_scheduling` the plan must be the oldest outstanding one: steps are
        applied in the order they were scheduled.
        """
        ...

    @property
    def async_scheduling(self) -> bool:
        """vLLM's async scheduling: the world may ask for the next plan while the last runs
        (schedule() with one plan outstanding). False: schedule() and on_step_done()
        alternate. Read-only; the continuous policy's is the scenario's
        `scheduler.async_scheduling`, request-level batching's always False."""
        ...

    def abort(self, request_id: int, now: float) -> Request | None:
        """Drop a queued or running request (its client went away): its KV is freed now and
        it appears in no later plan. Returns it, marked aborted, or None when the scheduler
        does not hold it (finished, rejected, unknown, aborted already).

        Between steps only: after on_step_done() and before the next schedule(), never
        while a scheduled plan is running (the plan still names the request). With
        async scheduling a plan is always outstanding: the continuous policy then frees
        the request at once, as vLLM does, and skips it when that plan is applied.
        """
        ...

    def decode_run(self, max_steps: int = 1 << 16) -> DecodeRun | None:
        """Before a schedule(): the next steps if their plans cannot change but for context
        growth (sim/core/decode_run.py), else None. Reads only; the world may ignore it.
        None while a plan is outstanding (async scheduling)."""
        ...

    def advance_decodes(self, run: DecodeRun, begin: int, end: int,
                        step_end_s: Sequence[float]) -> list[RunSegment]:
        """Apply steps [begin, end) of the run decode_run() just returned (the first `begin`
        applied by earlier calls), as step by step would have (blocks, counters, finishers
        finished at their step's end, `step_end_s[s]`); returns what ran, for the
        recorders. Nothing else may touch the scheduler during a run but add() and this."""
        ...

    def next_wakeup(self, now: float) -> float | None:
        """When to call schedule() again if it returned None; None = at the next arrival."""
        ...

    def close(self, now: float) -> None:
        """No more arrivals will come: a batching policy stops waiting for a full batch.

        The world calls it once, after the last add(), then calls schedule() again
        (an idle replica is woken). add() after close() is a caller's error.
        """
        ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def kv_blocks_used(self) -> int: ...

    @property
    def kv_slots_held(self) -> int:
        """Token slots allocated (paged) or reserved (contiguous) now: the waste numerator."""
        ...

    def has_unfinished(self) -> bool: ...

    # -- counters the worlds read (summaries, the TTFT diagnosis, speculation) ----------
    @property
    def speculative_tokens(self) -> int:
        """k: draft tokens per decoding sequence per step; 0 = no speculation."""
        ...

    @property
    def num_recomputed_tokens(self) -> int:
        """Computed tokens dropped by recompute preemption so far."""
        ...

    @property
    def kv_blocked(self) -> bool:
        """The last schedule() held requests back for lack of KV memory: admission stopped on
        blocks (continuous), or the running batch launched short on a full pool (request-level)."""
        ...
