"""A replica's decode runs fast-forwarded: one SimPy event for a run of plain decode steps.

A run of plain decode steps whose plans cannot change (sim/core/decode_run.py)
is priced in one call (_price: `LatencyModel.decode_run_s`, segment by
segment), held as one event at its end (_At, at the exact float step by step's
timeouts would have reached), cut by an arrival that joins it (_truncate: behind
a router; a lone replica's run already ends at the step the next arrival lands
in), caught up before each arrival (catch_up: its finishers leave, the scheduler's
advance_decodes applies its steps, _apply), recorded in bulk (_record: the recorders
and the fleet's log; a lone replica's once, at the run's end) and shown to an
observer that takes decode runs (_feed_observer). Every float and every record is
step by step's (`fast_forward=False`, the tests' oracle; docs/ARCHITECTURE.md,
"Exact fast-forward of decode runs").

It is apart from replica.py, the step-by-step loop that decides when a run may
start and waits on its event, because it is the one place that trades events for
bulk work, and its exactness argument is its own. ReplicaFastForward is a base of
Replica, whose fields are the attributes named in its class body.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.core.decode_run import DecodeRun, RunSegment, constant, decode_shape, split_part
from sim.core.plan import StepShape
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.observe.trace import StepObserver
from sim.results.record.recorder import RunRecorder
from sim.results.record.recording import record_decode_run
from sim.world.fleet_log import FleetLog, LogSource, _DecodeStep, emit_run, emit_step


@dataclass(slots=True)
class NextArrival:
    """When the next request arrives (inf after the last): where a decode run must stop."""

    at_s: float = 0.0


class _At(simpy.Event):
    """An event at the instant `at_s` itself, where step by step's timeouts would have led.

    No delay always lands there: now + delay rounds to the grid of the sum's binade,
    and from some `now` only every other float of it can be reached. So the event
    goes on SimPy's queue the way Environment.schedule puts a timeout there
    (simpy 4.1's (time, priority, id, event) entries), with the exact time.
    """

    def __init__(self, env: simpy.Environment, at_s: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        heapq.heappush(env._queue, (at_s, simpy.core.NORMAL, next(env._eid), self))  # noqa: SLF001


@dataclass(slots=True, eq=False)
class RunInProgress:
    """A decode run in progress: its step starts (ends_s[s]) and ends (ends_s[s + 1], also as
    floats in step_end_s), durations, how many of its steps are applied and how many
    recorded, and what ran of the applied steps not recorded yet."""

    run: DecodeRun
    recorders: tuple[RunRecorder, ...]
    ends_s: np.ndarray
    duration_s: np.ndarray
    step_end_s: list[float]
    finish_steps: list[int]  # the steps some finish in, not yet applied
    # each step's tokens as the client gets them: step_end_s plus the frontend's output terms
    # (the same list when those are 0)
    finish_s: Sequence[float] = field(default_factory=list)
    # async scheduling: the run's parts carry their blocks after their last step too
    # (apply_run_ahead), recorded as each step's blocks used
    ahead: bool = False
    applied: int = 0
    recorded: int = 0
    unrecorded: list[RunSegment] = field(default_factory=list)  # applied, not recorded
    at: simpy.Event | None = None  # the event at its end, which the replica waits on


class ReplicaFastForward:
    """Replica's decode runs, one event each (see the module doc)."""

    __slots__ = ()

    # Replica's fields
    env: simpy.Environment
    scheduler: Scheduler
    latency: LatencyModel
    observer: StepObserver | None
    on_done: Callable[[int], None] | None
    next_arrival: NextArrival | None
    fleet_log: FleetLog | None
    _run_arrivals: list[float] | None
    _run_feed: list | None
    _run: RunInProgress | None
    _source: LogSource
    delivery_s: float  # the frontend's output terms: a token reaches the client this late
    # and Replica._log, which hands steps to the fleet's log

    def catch_up(self, record: bool = False) -> None:
        """A run's finishers before now leave first (applied up to now): the router, the
        observer and the queue see what step by step's would. Behind a router they are
        recorded now too (and with `record`: a rejection is recorded after them); a lone
        replica records its run at its end, when every step's queue is known, in one pass.

        A lone replica's run is cut at the step now falls in: when nobody finishes from
        there on, that step is applied now too (the same sequences run on and nobody
        leaves: no reader of the running set or the queue can tell), not in a call of
        its own."""
        running = self._run
        if running is None:
            return
        upto = bisect.bisect_left(running.step_end_s, self.env.now)
        finishers = bool(running.finish_steps) and running.finish_steps[0] < upto
        if self.fleet_log is not None:
            if finishers:
                self._record(upto)
            return
        if finishers:
            steps = len(running.step_end_s)
            whole = steps < running.run.steps and running.finish_steps[-1] < upto
            self._apply(steps if whole else upto)
        if record:
            self._record(upto)

    def _begin_run(self, run: DecodeRun, recorders: tuple[RunRecorder, ...]) -> simpy.Event:
        """Start holding the clock for a decode run as one event: the event at its end,
        which the world waits for before calling _end_run.

        An arrival at a step's end is seen by the next schedule() (fleet._Arrival
        fires first), so a run that an arrival may join ends with the step whose
        end is at or after it. Behind a router the next arrival may go elsewhere: the
        run is cut when one joins it (_truncate). Step ends are the running float sum
        SimPy would have reached one timeout at a time.
        """
        env = self.env
        assert self.next_arrival is not None
        behind = self.fleet_log is not None
        at_s = self.next_arrival.at_s if run.stops_at_arrival and not behind else math.inf
        # [now, each step's duration]: its running sum is the step ends
        timeline = self._price(run, env.now, at_s)
        ends_s, duration_s = timeline.cumsum(), timeline[1:]
        step_end_s = ends_s[1:].tolist()
        steps = len(step_end_s)
        if at_s < math.inf:
            steps = min(steps, bisect.bisect_left(step_end_s, at_s) + 1)
            del step_end_s[steps:]
        self._run_arrivals = []
        out_s = self.delivery_s
        finish_steps = [segment[0] - 1 for segment in run.segments if segment[0] <= steps]
        ahead = bool(getattr(self.scheduler, "async_scheduling", False))
        if ahead:  # its last plan is made during its last step: the run is cut first
            if steps < run.steps:
                run = run._replace(steps=steps, segments=tuple(
                    segment for segment in run.segments if segment[0] < steps))
            finish_s: Sequence[float] = _LaggedEnds(step_end_s, out_s, getattr(
                self.latency, "output_lag_s", None), run)
        else:
            finish_s = [t + out_s for t in step_end_s] if out_s else step_end_s
        self._run = RunInProgress(run, recorders, ends_s, duration_s, step_end_s,
                                  finish_steps, finish_s=finish_s, ahead=ahead)
        if self.observer is not None:
            self._run_feed = [ends_s[:steps], duration_s[:steps], run.kv_blocked, 0]
        if behind:
            self._source.horizon_s = step_end_s[0]
        self._run.at = _At(env, step_end_s[-1])
        return self._run.at

    def _truncate(self, state: RunInProgress) -> None:
        """An arrival joined a run that began with an empty queue: the run now ends with the
        step the arrival landed in (its end at or after now), as a lone replica's would."""
        steps = bisect.bisect_left(state.step_end_s, self.env.now) + 1
        if steps >= len(state.step_end_s):
            return
        del state.step_end_s[steps:]
        state.finish_steps = [f for f in state.finish_steps if f < steps]
        if self._run_feed is not None:
            self._run_feed[0], self._run_feed[1] = (self._run_feed[0][:steps],
                                                    self._run_feed[1][:steps])
        at, old = _At(self.env, state.step_end_s[-1]), state.at
        assert old is not None
        at.callbacks, old.callbacks = old.callbacks, []  # the replica now waits on `at`
        state.at = at

    def _end_run(self) -> None:
        """The run's end: show the observer the rest, apply and record its steps."""
        state = self._run
        assert state is not None and self.env.now == state.step_end_s[-1]
        if self._run_feed is not None:
            self._feed_observer(math.inf)
            self._run_feed = None
        self._record(len(state.step_end_s))
        self._run = self._run_arrivals = None
        if self.fleet_log is not None:
            self._source.horizon_s = math.inf
            self.fleet_log.flush(self.env.now)

    def _price(self, run: DecodeRun, now_s: float, at_s: float) -> np.ndarray:
        """`now_s`, then the durations of the run's steps up to the one running at `at_s`
        (all of them if it ends sooner): segment by segment, a segment's steps at least its
        first one's long (contexts only grow), so no more are priced than can run, and its
        steps times its first one's (at most their sum) counted off the time left: pricing
        goes on while time may be left. (Too few priced would only end the run early: the
        next run goes on from the same floats.)"""
        price, step_time = self.latency.decode_run_s, self.latency.step_time
        pieces: list = [(now_s,)]
        within_s = at_s - now_s
        for _, steps, shape in run.segment_lengths():
            if within_s == math.inf:
                pieces.append(price(shape, steps))
                continue
            first_s = step_time(shape)
            if first_s > 0:
                steps = min(steps, int(within_s / first_s) + 2)
            pieces.append(price(shape, steps))
            within_s -= steps * first_s
            if within_s < 0:
                break
        return np.concatenate(pieces)

    def _apply(self, upto: int) -> None:
        """Apply the running decode run's steps before `upto` not applied yet (the
        scheduler's side: blocks taken, finishers retired), keeping what ran to record."""
        state = self._run
        assert state is not None
        if upto <= state.applied:
            return
        state.unrecorded += self.scheduler.advance_decodes(state.run, state.applied, upto,
                                                           state.finish_s)
        state.applied = upto
        while state.finish_steps and state.finish_steps[0] < upto:
            del state.finish_steps[0]

    def _record(self, upto: int) -> None:
        """Record the running decode run's steps before `upto` not recorded yet (applied
        first where they are not), in step by step's order: the recorders, the fleet's log
        and the finishers' count see them as step by step's would by then (a step ending
        at an arrival's instant is not over: the arrival goes first)."""
        state = self._run
        assert state is not None and self._run_arrivals is not None
        begin = state.recorded
        if upto <= begin:
            return
        self._apply(upto)
        state.recorded = upto
        if self.fleet_log is not None:  # the first step not handed to the log yet
            self._source.horizon_s = (state.step_end_s[upto] if upto < len(state.step_end_s)
                                      else math.inf)
        run, ends_s, duration_s = state.run, state.ends_s, state.duration_s
        if state.applied > upto:  # the steps from `upto` on are recorded later
            ran, state.unrecorded = _split_at(state.unrecorded, upto, int(state.ahead))
        else:
            ran, state.unrecorded = state.unrecorded, []
        if self._run_arrivals:  # joined the queue by each step's end
            waiting = np.array(self._run_arrivals).searchsorted(ends_s[begin + 1:upto + 1],
                                                                side="right")
            waiting += run.num_waiting
        else:
            waiting = constant(upto - begin, run.num_waiting)
        recorders, done, log = state.recorders, 0, self.fleet_log
        for segment in ran:
            a, k = segment.start, segment.run.steps
            if k and state.ahead:
                _record_ahead(recorders, segment.run, ends_s[a:a + k], duration_s[a:a + k],
                              waiting[a - begin:a - begin + k])
            elif k:
                queued_each = waiting[a - begin:a - begin + k]
                record_decode_run(recorders, segment.run, ends_s[a:a + k], duration_s[a:a + k],
                                  queued_each)
                if log is not None:
                    self._log(state.step_end_s[a:a + k], ends_s[a:a + k].tolist(),
                              emit_run(segment.run, ends_s[a:a + k], duration_s[a:a + k],
                                       queued_each))
            finish = segment.finish
            if finish is not None:  # the finishers' step, as record_step would record it
                f = a + k
                start_s, step_s = float(ends_s[f]), float(duration_s[f])
                queued = int(waiting[f - begin])
                for recorder in recorders:
                    recorder.record_step(start_s, step_s, finish.plan, queued, finish.num_running,
                                         finish.kv_blocks_used, finish.kv_slots_held)
                    for request in finish.finished:
                        recorder.record_finished(request)
                if log is not None:
                    self._log([state.step_end_s[f]], [start_s], emit_step(
                        finish.plan, start_s, step_s, queued, finish.num_running,
                        finish.kv_blocks_used, finish.kv_slots_held, finish.finished, None))
                done += len(finish.finished)
        if done and self.on_done is not None:
            self.on_done(done)

    def _feed_observer(self, until_s: float) -> None:
        """Show the observer the run's steps that started before `until_s` (an arrival's
        instant: step by step it would have seen their on_step by then)."""
        feed, observer = self._run_feed, self.observer
        assert feed is not None and observer is not None and self._run is not None
        start_s, duration_s, kv_blocked, seen = feed
        # the steps starting before until_s: the first, at the run's start, and each one
        # after a step end before it (bisected in the run's step ends, as floats)
        ends_s = self._run.step_end_s
        upto = 0
        if start_s[0] < until_s:
            upto = bisect.bisect_left(ends_s, until_s, 0, len(ends_s) - 1) + 1
        if upto > seen:
            observer.on_decode_steps(start_s[seen:upto], duration_s[seen:upto], kv_blocked)
            feed[3] = upto


def _split_at(ran: list[RunSegment], upto: int, extra: int = 0
              ) -> tuple[list[RunSegment], list[RunSegment]]:
    """What ran before step `upto`, and from it on (no finisher's step from `upto` on);
    `extra`: see split_part."""
    for j, segment in enumerate(ran):
        if segment.start >= upto:
            return ran[:j], ran[j:]
        if segment.start + segment.run.steps > upto:
            assert segment.finish is None
            head, tail = split_part(segment.run, upto - segment.start, extra)
            return ran[:j] + [RunSegment(segment.start, head, None)], \
                [RunSegment(upto, tail, None)] + ran[j + 1:]
    return ran, []


class _LaggedEnds:
    """A run's finish times under async scheduling, read at its finishers' steps only: as
    the step-by-step world stamps them, the step's end plus the frontend's output terms,
    plus the output lag of the step's shape (sim.latency.roofline.output_lag_s)."""

    __slots__ = ("_ends_s", "_out_s", "_lag", "_run")

    def __init__(self, ends_s: list[float], out_s: float,
                 lag: Callable[[StepShape], float] | None, run: DecodeRun) -> None:
        self._ends_s, self._out_s, self._lag, self._run = ends_s, out_s, lag, run

    def __len__(self) -> int:
        return len(self._ends_s)

    def __getitem__(self, s: int) -> float:
        done_s = self._ends_s[s] + self._out_s
        if self._lag is not None:
            for start, length, shape in self._run.segment_lengths():
                if s < start + length:
                    done_s += self._lag(decode_shape(shape, s - start))
                    break
        return done_s


def _record_ahead(recorders: tuple[RunRecorder, ...], part: DecodeRun, start_s: np.ndarray,
                  duration_s: np.ndarray, waiting: np.ndarray) -> None:
    """A run part's plain steps under async scheduling, as record_step records each: the
    blocks held while a step runs, and used after it (the next plan's taken: its
    kv_blocks_used has one entry more than its steps, apply_run_ahead)."""
    shape = part.shape
    n, total, bs = shape.num_decodes, shape.decode_context_sum, part.block_size
    ids, new = range(n), (n,)
    blocks = part.kv_blocks_used.tolist()
    starts, durations, queued = start_s.tolist(), duration_s.tolist(), waiting.tolist()
    for recorder in recorders:
        record = recorder.record_step
        for k, step_s in enumerate(durations):
            record(starts[k], step_s, _DecodeStep(ids, shape, (total + k * n,), new),  # type: ignore[arg-type]
                   queued[k], n, blocks[k + 1], blocks[k] * bs)
