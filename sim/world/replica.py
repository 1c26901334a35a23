"""One replica in the SimPy world: a scheduler, its KV pool and a latency model, step by step.

One event per engine step: a replica asks its scheduler for a plan, holds the
simulated clock for the step's predicted latency, then applies it. Arrivals
during a step are queued at once (sim.world.fleet submits them) and seen at
the next schedule(). Finished requests are handed to the recorders and
dropped, so memory follows the requests in flight, not the requests done. A
replica's optional observer (sim.observe.trace.StepObserver) sees each
accepted arrival and each step just before it runs: the TTFT diagnosis and
request tracing hang there. A fleet records each step and request twice: in
its replica's recorder and in the fleet's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from sim.core.kv import KVManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.observe.trace import StepObserver
from sim.results.metrics import RunRecorder
from sim.results.recording import record_step

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
    _wake: simpy.Event | None = field(default=None, init=False)
    _aborts: list[int] = field(default_factory=list, init=False)  # asked during a step
    _stepping: bool = field(default=False, init=False)
    _cached: Callable[[Request], int] = field(default=_no_cache, init=False)

    def __post_init__(self) -> None:
        if self.kv is not None:  # every KV pool answers (0 without a prefix cache)
            self._cached = self.kv.cached_prefix_tokens

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
    def submit(self, request: Request) -> None:
        if not self.scheduler.add(request, self.env.now):
            self.recorder.record_rejected(request)
            if self.fleet_recorder is not None:
                self.fleet_recorder.record_rejected(request)
            if self.on_done is not None:
                self.on_done(1)
            return
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

    def run(self):  # noqa: ANN201 - a SimPy process generator
        env, scheduler = self.env, self.scheduler
        recorders = (self.recorder,) if self.fleet_recorder is None else (
            self.recorder, self.fleet_recorder)
        step_time = self.latency.step_time
        speculate, observer = self.speculate, self.observer
        while True:
            plan = scheduler.schedule(env.now)
            if plan is None:
                self._wake = env.event()
                wakeup_s = scheduler.next_wakeup(env.now)
                if wakeup_s is None:
                    yield self._wake
                else:
                    yield self._wake | env.timeout(max(0.0, wakeup_s - env.now))
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
            if finished and self.on_done is not None:
                self.on_done(len(finished))
            if self._aborts:
                self._apply_aborts()
