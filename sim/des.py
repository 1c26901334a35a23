"""The SimPy world: an arrival process feeding replicas through a router.

One event per engine step: a replica asks its scheduler for a plan, holds
the simulated clock for the step's predicted latency, then applies it.
Arrivals during a step are queued at once and seen at the next schedule().
After the last arrival every scheduler is closed (no more requests will come)
and idle replicas are woken, so static batching launches its short last batch.
Finished requests are handed to the recorder and dropped, so memory follows
the requests in flight, not the requests done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import simpy

from sim.core.plan import StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.metrics import RunRecorder

SCRIPTED = StepResult()  # the simulator's outputs are scripted: no token values


@dataclass(slots=True, eq=False)
class Replica:
    """One serving instance: a scheduler, its KV pool, a latency model."""

    env: simpy.Environment
    scheduler: Scheduler
    latency: LatencyModel
    recorder: RunRecorder
    on_done: Callable[[int], None] | None = None
    _wake: simpy.Event | None = field(default=None, init=False)

    def submit(self, request: Request) -> None:
        if not self.scheduler.add(request, self.env.now):
            self.recorder.record_rejected(request)
            if self.on_done is not None:
                self.on_done(1)
            return
        self._wake_up()

    def close(self) -> None:
        """No more arrivals: tell the scheduler, and let an idle replica schedule again."""
        self.scheduler.close(self.env.now)
        self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self):  # noqa: ANN201 - a SimPy process generator
        env, scheduler, recorder = self.env, self.scheduler, self.recorder
        step_time = self.latency.step_time
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
            yield env.timeout(duration_s)
            finished = scheduler.on_step_done(plan, SCRIPTED, env.now)
            recorder.record_step(start_s, duration_s, plan, scheduler.num_waiting,
                                 scheduler.num_running, scheduler.kv_blocks_used, held)
            for request in finished:
                recorder.record_finished(request)
            if finished and self.on_done is not None:
                self.on_done(len(finished))


class _Arrival(simpy.Event):
    """A timeout that fires before any step ending at the same instant.

    The step contract says a request that has arrived by the time a step ends
    is visible to the next schedule(); SimPy would otherwise order same-time
    events by creation, so the outcome would depend on who set a timer first.
    """

    def __init__(self, env: simpy.Environment, delay_s: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, simpy.core.URGENT, delay_s)


def _arrivals(env: simpy.Environment, requests: Iterable[Request],
              route: Callable[[Request], Replica], replicas: Iterable[Replica]):  # noqa: ANN202
    for request in requests:
        delay_s = request.arrival_s - env.now
        if delay_s > 0:
            yield _Arrival(env, delay_s)
        route(request).submit(request)
    for replica in replicas:
        replica.close()


def simulate(requests: Iterable[Request], scheduler: Scheduler, latency: LatencyModel,
             recorder: RunRecorder, on_done: Callable[[int], None] | None = None) -> float:
    """Run one replica to completion; returns the simulated end time in seconds."""
    env = simpy.Environment()
    replica = Replica(env, scheduler, latency, recorder, on_done)
    env.process(replica.run())
    env.process(_arrivals(env, requests, lambda _request: replica, [replica]))
    env.run()
    return float(env.now)
