"""One replica in the SimPy world: a scheduler, its KV pool and a latency model, step by step.

One event per engine step at most: a replica asks its scheduler for a plan,
holds the simulated clock for the step's predicted latency, then applies it.
A run of plain decode steps whose plans cannot change (sim/core/decode_run.py)
is one event: priced in one call, ended at the step the next arrival lands in
when that arrival could be admitted, applied and recorded in bulk, with the
same floats as step by step (`fast_forward=False`, the tests' oracle). Behind
a router that reads only running sets a replica fast-forwards too: its
running set is caught up before each arrival (`catch_up`), a run an arrival
joins is cut at the step it landed in (`_truncate`), and its steps reach the
fleet's recorder through the fleet's log in step by step's global order
(sim/world/fleet_log.py). Behind a router reading KV, with speculation
(random acceptance) or an observer that needs every plan (a traced timeline,
the slot picture) it runs step by step. The TTFT diagnosis takes a run's steps in bulk, fed to it
before any arrival that falls after their start. Arrivals
during a step are queued at once (sim.world.fleet submits them) and seen at
the next schedule(). Finished requests are handed to the recorders and
dropped, so memory follows the requests in flight, not the requests done. A
replica's optional observer (sim.observe.trace.StepObserver) sees each
accepted arrival and each step just before it runs: the TTFT diagnosis and
request tracing hang there. A fleet records each step and request twice: in
its replica's recorder and in the fleet's.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.core.decode_run import DecodeRun
from sim.core.kv import KVManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.observe.trace import StepObserver
from sim.results.metrics import RunRecorder
from sim.results.recording import record_decode_run, record_step
from sim.world.fleet_log import (
    FleetLog,
    LogSource,
    Steps,
    after_step,
    after_timer,
    after_wake,
    after_wake_condition,
    emit_run,
    emit_step,
)

SCRIPTED = StepResult()  # the simulator's outputs are scripted: no token values


@dataclass(frozen=True, slots=True)
class ReplicaSetup:
    """What one replica is built from; `kv` lets a router read its load and prefix cache."""

    scheduler: Scheduler
    latency: LatencyModel
    recorder: RunRecorder
    kv: KVManager | None = None
    # speculative decoding: how many tokens each sequence of a plan emitted (the
    # acceptance process, sim.world.speculation.AcceptanceSampler); None = one per emitter
    speculate: Callable[[StepPlan], StepResult] | None = None
    observer: StepObserver | None = None  # sees each accepted arrival and step (sim.observe)
    fast_forward: bool = True  # False: every step an event (the oracle fast-forward must equal)


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
class _Running:
    """A decode run in progress: its step starts (ends_s[s]) and ends (ends_s[s + 1], also as
    floats in step_end_s), durations, and how many of its steps are applied and recorded."""

    run: DecodeRun
    recorders: tuple[RunRecorder, ...]
    ends_s: np.ndarray
    duration_s: np.ndarray
    step_end_s: list[float]
    finish_steps: list[int]  # the steps some finish in, not yet applied
    applied: int = 0
    at: simpy.Event | None = None  # the event at its end, which the replica waits on


def _no_cache(_request: Request) -> int:
    return 0


@dataclass(slots=True, eq=False)
class Replica:
    """One serving instance: a scheduler, its KV pool, a latency model."""

    env: simpy.Environment
    scheduler: Scheduler
    latency: LatencyModel
    recorder: RunRecorder
    on_done: Callable[[int], None] | None = None
    kv: KVManager | None = None
    fleet_recorder: RunRecorder | None = None  # also records here (None: one replica)
    speculate: Callable[[StepPlan], StepResult] | None = None  # see ReplicaSetup
    observer: StepObserver | None = None  # see ReplicaSetup
    fast_forward: bool = True  # see ReplicaSetup
    next_arrival: NextArrival | None = None  # kept by the fleet; None: never fast-forward
    # behind a router: the fleet's recorder gets this replica's steps through the log, in
    # step by step's global order (None: straight to fleet_recorder, one event per step)
    fleet_log: FleetLog | None = None
    _wake: simpy.Event | None = field(default=None, init=False)
    _aborts: list[int] = field(default_factory=list, init=False)  # asked during a step
    _stepping: bool = field(default=False, init=False)
    _run_arrivals: list[float] | None = field(default=None, init=False)  # during a run
    # a run's step starts and durations and how many the observer has seen, during a run
    _run_feed: list | None = field(default=None, init=False)
    _run: _Running | None = field(default=None, init=False)  # during a decode run
    _cached: Callable[[Request], int] = field(default=_no_cache, init=False)
    # this replica's queue in fleet_log (a stand-in nobody reads without one)
    _source: LogSource = field(default_factory=LogSource, init=False)
    _cause: Callable[[], tuple] = field(default=after_wake(0), init=False)  # the last resume
    _wake_no: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kv is not None:  # every KV pool answers (0 without a prefix cache)
            self._cached = self.kv.cached_prefix_tokens
        if self.fleet_log is not None:
            self._source = self.fleet_log.source()

    # -- what a router reads (sim.world.router.ReplicaView) --------------------------
    @property
    def num_outstanding(self) -> int:
        return self.scheduler.num_waiting + self.scheduler.num_running

    @property
    def kv_load(self) -> float:
        usable = self.kv.num_usable_blocks if self.kv is not None else 0
        return self.scheduler.kv_blocks_used / usable if usable else 0.0

    def cached_prefix_tokens(self, request: Request) -> int:
        return self._cached(request)

    # -- the world -------------------------------------------------------------
    def catch_up(self) -> None:
        """A run's finishers before now leave first (applied and recorded up to now): the
        router, the observer and the recorders see what step by step's would."""
        running = self._run
        if running is not None and running.finish_steps:
            upto = bisect.bisect_left(running.step_end_s, self.env.now)
            if running.finish_steps[0] < upto:
                self._advance(upto)

    def submit(self, request: Request) -> None:
        self.catch_up()
        if not self.scheduler.add(request, self.env.now):
            self.recorder.record_rejected(request)
            if self.fleet_log is not None:  # after every step ended before now
                self.fleet_log.rejected(request, self.env.now)
            elif self.fleet_recorder is not None:
                self.fleet_recorder.record_rejected(request)
            if self.on_done is not None:
                self.on_done(1)
            return
        running = self._run
        if running is not None and running.run.stops_at_arrival and self.fleet_log is not None:
            self._truncate(running)
        if self._run_arrivals is not None:
            self._run_arrivals.append(self.env.now)
            if self._run_feed is not None:
                self._feed_observer(self.env.now)
        if self.observer is not None:
            self.observer.on_arrival(request, self.env.now)
        self._wake_up()

    def close(self) -> None:
        """No more arrivals: tell the scheduler, and let an idle replica schedule again."""
        self.scheduler.close(self.env.now)
        self._wake_up()

    def abort(self, request_id: int) -> None:
        """Drop a request (its client went away): now when idle, else as the running step ends
        (the step contract aborts between steps). It is recorded with the rejected, by reason."""
        if self._run_arrivals is not None or self.fleet_log is not None:  # steps are fixed
            raise RuntimeError("an abort during a decode run: a replica whose requests may "
                               "be aborted runs step by step (fast_forward=False)")
        self._aborts.append(request_id)
        if not self._stepping:
            self._apply_aborts()

    def _apply_aborts(self) -> None:
        aborts, self._aborts = self._aborts, []
        for request_id in aborts:
            request = self.scheduler.abort(request_id, self.env.now)
            if request is None:
                continue  # finished (or aborted) already
            self.recorder.record_rejected(request)
            if self.fleet_recorder is not None:
                self.fleet_recorder.record_rejected(request)
            if self.on_done is not None:
                self.on_done(1)
        self._wake_up()  # a freed seat or blocks may let waiting requests in

    def _wake_up(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
            if self.fleet_log is not None:
                self._wake_no = self.fleet_log.next_wake()

    def run(self):  # noqa: ANN201 - a SimPy process generator
        env, scheduler = self.env, self.scheduler
        log = self.fleet_log
        recorders = (self.recorder,) if self.fleet_recorder is None or log is not None else (
            self.recorder, self.fleet_recorder)
        step_time = self.latency.step_time
        speculate, observer = self.speculate, self.observer
        decode_run = scheduler.decode_run if (
            self.fast_forward and (observer is None or observer.takes_decode_runs)
            and speculate is None and (self.fleet_recorder is None or log is not None)
            and self.next_arrival is not None) else None
        while True:
            if decode_run is not None and (run := decode_run()) is not None:
                yield self._begin_run(run, recorders)
                self._end_run()
                continue
            plan = scheduler.schedule(env.now)
            if plan is None:
                self._wake = env.event()
                wakeup_s = scheduler.next_wakeup(env.now)
                if wakeup_s is None:
                    yield self._wake
                    if log is not None:
                        self._cause = after_wake(self._wake_no)
                else:
                    timer = env.timeout(max(0.0, wakeup_s - env.now))
                    created_s, created, order = env.now, self._cause, []
                    if log is not None:  # which child the condition fired on
                        timer.callbacks.append(order.append)
                        self._wake.callbacks.append(order.append)
                    yield self._wake | timer
                    if log is not None:
                        self._cause = (after_timer(created_s, created, env.now)
                                       if order[0] is timer else
                                       after_wake_condition(self._wake_no))
                self._wake = None
                continue
            start_s = env.now
            held = scheduler.kv_slots_held  # while the step runs: before finishers free
            duration_s = step_time(plan.shape)
            if observer is not None:
                observer.on_step(start_s, duration_s, plan)
            self._stepping = True
            yield env.timeout(duration_s)
            self._stepping = False
            result = SCRIPTED if speculate is None else speculate(plan)
            finished = scheduler.on_step_done(plan, result, env.now)
            record_step(recorders, scheduler, start_s, duration_s, plan, finished, held,
                        None if speculate is None else result)
            if log is not None:
                self._log([env.now], [start_s], emit_step(
                    plan, start_s, duration_s, scheduler.num_waiting, scheduler.num_running,
                    scheduler.kv_blocks_used, held, finished,
                    None if speculate is None else result))
            if finished and self.on_done is not None:
                self.on_done(len(finished))
            if self._aborts:
                self._apply_aborts()

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
        steps = len(duration_s)
        if at_s < math.inf:
            steps = min(steps, int(ends_s[1:].searchsorted(at_s)) + 1)
        self._run_arrivals = []
        self._run = _Running(run, recorders, ends_s, duration_s, ends_s[1:steps + 1].tolist(),
                             [start - 1 for start, _ in run.segments[1:] if start <= steps])
        if self.observer is not None:
            self._run_feed = [ends_s[:steps], duration_s[:steps], run.kv_blocked, 0]
        if behind:
            self._source.horizon_s = float(ends_s[1])
        self._run.at = _At(env, float(ends_s[steps]))
        return self._run.at

    def _truncate(self, state: _Running) -> None:
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
        self._advance(len(state.step_end_s))
        self._run = self._run_arrivals = None
        if self.fleet_log is not None:
            self._source.horizon_s = math.inf
            self.fleet_log.flush(self.env.now)

    def _log(self, end_s: Sequence[float], start_s: Sequence[float], emit: Callable) -> None:
        """Hand steps to the fleet's log, resumed before the first as self._cause says."""
        assert self.fleet_log is not None
        steps = Steps(end_s, start_s, self._cause, emit)
        self.fleet_log.add(self._source, steps)
        self._cause = after_step(steps)

    def _price(self, run: DecodeRun, now_s: float, at_s: float) -> np.ndarray:
        """`now_s`, then the durations of the run's steps up to the one running at `at_s`
        (all of them if it ends sooner): segment by segment, a segment's steps at least its
        first one's long (contexts only grow), so no more are priced than can run."""
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
            piece = price(shape, steps)
            pieces.append(piece)
            within_s -= float(np.add.reduce(piece))
            if within_s < 0:
                break
        return np.concatenate(pieces)

    def _advance(self, upto: int) -> None:
        """Apply and record the running decode run's steps before `upto` not applied yet.

        Called at each arrival during the run with the steps that ended before it (a
        step ending at the arrival's instant is not over: the arrival goes first), so
        the scheduler, the observer and the recorders see what step by step's would
        then, in the same order; and at the run's end with the rest."""
        state = self._run
        assert state is not None and self._run_arrivals is not None
        begin = state.applied
        if upto <= begin:
            return
        state.applied = upto
        if self.fleet_log is not None:  # the first step not handed to the log yet
            self._source.horizon_s = (state.step_end_s[upto] if upto < len(state.step_end_s)
                                      else math.inf)
        while state.finish_steps and state.finish_steps[0] < upto:
            del state.finish_steps[0]
        run, ends_s, duration_s = state.run, state.ends_s, state.duration_s
        ran = self.scheduler.advance_decodes(run, begin, upto, state.step_end_s)
        if self._run_arrivals:  # joined the queue by each step's end
            waiting = np.array(self._run_arrivals).searchsorted(ends_s[begin + 1:upto + 1],
                                                                side="right")
            waiting += run.num_waiting
        else:
            waiting = np.full(upto - begin, run.num_waiting, dtype=np.int64)
        recorders, done, log = state.recorders, 0, self.fleet_log
        for segment in ran:
            a, k = segment.start, segment.run.steps
            if k:
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
        assert feed is not None and observer is not None
        start_s, duration_s, kv_blocked, seen = feed
        upto = int(np.searchsorted(start_s, until_s, side="left"))
        if upto > seen:
            observer.on_decode_steps(start_s[seen:upto], duration_s[seen:upto], kv_blocked)
            feed[3] = upto
