"""A fleet's recorder fed in step by step's order while its replicas fast-forward.

The fleet's recorder adds every replica's steps into one set of float sums and
one row order, so it must get them in the order one event per step would
process their ends: by end time, then, for ends at the same instant, in
SimPy's order of creation of the step's timeout: by start time, then by the
order the replicas resumed at that start. A replica resumes at an instant
after its own step end there (those in the order they were processed), after
a wake from an arrival (in submit order: wakes are created during the arrival,
which is URGENT), or after a timer condition (created when its first child is
processed: timers created earlier first, then wakes, then timers created then).
A replica hands its steps here (one finished step, or a run segment's plain
steps as arrays) with the key of its resume before the first, and the log
passes them on once no replica can still produce an earlier one: below the
start of every run in progress and below now (a replica stepping one event at
a time ends its step at or after now).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sim.core.decode_run import DecodeRun, decode_shape
from sim.core.plan import StepShape
from sim.results.record.recorder import RunRecorder


@dataclass(slots=True, eq=False)
class Steps:
    """Step ends of one replica, in order: `emit(recorder, i, j)` records steps [i, j).
    `cause`: the resume key before step 0 (a callable: resolved when compared, since it
    may name a step not yet passed on); later steps follow their predecessor."""

    end_s: Sequence[float]
    start_s: Sequence[float]
    cause: Callable[[], tuple]
    emit: Callable[[RunRecorder, int, int], None]
    last_seq: int = -1  # the seq its last step was passed on with


def after_step(steps: Steps) -> Callable[[], tuple]:
    """Resumed by its own step end: in the order that end was processed."""
    return lambda: (0, steps.last_seq)


def after_wake(wake_no: int) -> Callable[[], tuple]:
    """Resumed by an arrival's wake: in submit order, after every step end there."""
    return lambda: (1, wake_no)


def after_timer(created_s: float, created: Callable[[], tuple], at_s: float
                ) -> Callable[[], tuple]:
    """Resumed by a timer condition: after every direct resume; among conditions, a timer
    created before now by its creation (time, creator), then wakes, then timers created now."""
    if created_s < at_s:
        return lambda: (2, 0, created_s, created())
    return lambda: (2, 2, created())


def after_wake_condition(wake_no: int) -> Callable[[], tuple]:
    return lambda: (2, 1, wake_no)


@dataclass(slots=True, eq=False)
class LogSource:
    """One replica's (or the arrivals') steps waiting to be passed on."""

    pending: deque[Steps] = field(default_factory=deque)
    at: int = 0  # the next step of pending[0]
    horizon_s: float = float("inf")  # a run's first step end while it runs


@dataclass(slots=True, eq=False)
class FleetLog:
    """Buffered steps per replica, passed on to `recorder` in step by step's order."""

    recorder: RunRecorder
    sources: list[LogSource] = field(default_factory=list)
    seq: int = 0
    wakes: int = 0
    rejections: int = 0
    _arrivals: LogSource = field(default_factory=LogSource)  # rejections, in arrival order

    def __post_init__(self) -> None:
        self.sources.append(self._arrivals)

    def rejected(self, request: Any, now_s: float) -> None:
        """A request rejected at its arrival: after every step that ended before now, before
        every step ending now (the arrival is URGENT), in submit order."""
        self.rejections += 1
        rank = (-1, self.rejections)
        self._arrivals.pending.append(Steps([now_s], [-math.inf], lambda: rank,
                                            lambda recorder, _i, _j: recorder.record_rejected(
                                                request)))

    def source(self) -> LogSource:
        self.sources.append(LogSource())
        return self.sources[-1]

    def next_wake(self) -> int:
        self.wakes += 1
        return self.wakes

    def add(self, source: LogSource, steps: Steps) -> None:
        source.pending.append(steps)

    def flush(self, now_s: float) -> None:
        """Pass on every step that ends before now and before any running run's start."""
        limit_s = min([now_s, *(s.horizon_s for s in self.sources)])
        ready: list[tuple[float, Steps, int]] = []
        for source in self.sources:
            pending, i = source.pending, source.at
            while pending:
                steps = pending[0]
                ends = steps.end_s
                j = bisect.bisect_left(ends, limit_s, i)
                ready.extend([(ends[k], steps, k) for k in range(i, j)])
                if j < len(ends):
                    i = j
                    break
                pending.popleft()
                i = 0
            source.at = i
        if not ready:
            return
        ready.sort(key=_first)  # stable: each replica's steps stay in order
        at, n, batch = 0, len(ready), None
        while at < n:
            end_s = ready[at][0]
            stop = at + 1
            while stop < n and ready[stop][0] == end_s:
                stop += 1
            group = ready[at:stop]
            if len(group) > 1:  # ends at one instant: in the order their steps were created
                self._emit(batch)  # the keys read the seqs of the steps before
                batch = None
                group.sort(key=_created)
            for _, steps, i in group:
                if batch is not None and batch[0] is steps and batch[2] == i:
                    batch[2] = i + 1
                else:
                    self._emit(batch)
                    batch = [steps, i, i + 1]
            at = stop
        self._emit(batch)

    def _emit(self, batch: list | None) -> None:
        """Record steps [i, j) of one replica's `steps`; they take the next seqs."""
        if batch is not None:
            steps, i, j = batch
            steps.emit(self.recorder, i, j)
            self.seq += j - i
            steps.last_seq = self.seq - 1


def _created(item: tuple[float, Steps, int]) -> tuple:
    """A step end's place among ends at its instant: its start, then its replica's resume."""
    _, steps, i = item
    return (steps.start_s[i], steps.cause() if i == 0 else (0, steps.last_seq))


def _first(item: tuple[float, Steps, int]) -> float:
    return item[0]


def emit_step(plan: Any, start_s: float, duration_s: float, waiting: int, running: int,
              used: int, held: int, finished: Sequence[Any], result: Any
              ) -> Callable[[RunRecorder, int, int], None]:
    """record_step's calls for one step, its figures read when it ended."""
    def emit(recorder: RunRecorder, _i: int, _j: int) -> None:
        if result is not None:
            recorder.record_speculation(plan, result)
        recorder.record_step(start_s, duration_s, plan, waiting, running, used, held)
        for request in finished:
            recorder.record_finished(request)
    return emit


class _DecodeStep(NamedTuple):
    """What record_step reads of a plain decode step's plan: the batch, its shape and its
    live tokens (contexts plus one new token each, here as two sums).

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    request_ids: range
    shape: StepShape
    context_tokens: tuple[int]
    num_new_tokens: tuple[int]


BULK_STEPS = 8  # from this many steps in a row, one record_decode_run call is cheaper


def emit_run(run: DecodeRun, start_s: Any, duration_s: Any, waiting: Any
             ) -> Callable[[RunRecorder, int, int], None]:
    """Steps [i, j) of a run segment's plain steps, as record_step would record each
    (record_decode_run adds the same floats in the same order for a longer stretch)."""
    shape, n = run.shape, run.shape.num_decodes
    ids, new, held = range(n), (n,), run.kv_blocks_used * run.block_size

    def emit(recorder: RunRecorder, i: int, j: int) -> None:
        if j - i >= BULK_STEPS:
            part = run if i == 0 else DecodeRun(run.steps - i, decode_shape(shape, i),
                                                run.kv_blocks_used[i:], run.num_waiting,
                                                run.stops_at_arrival, run.block_size,
                                                run.kv_blocked)
            recorder.record_decode_run(part, start_s[i:j], duration_s[i:j], waiting[i:j])
            return
        for k in range(i, j):
            step = _DecodeStep(ids, shape, (shape.decode_context_sum + k * n,), new)
            recorder.record_step(float(start_s[k]), float(duration_s[k]), step,  # type: ignore[arg-type]
                                 int(waiting[k]), n, int(run.kv_blocks_used[k]), int(held[k]))
    return emit
