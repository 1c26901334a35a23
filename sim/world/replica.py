"""One replica in the SimPy world: a scheduler, its KV pool and a latency model, step by step.

Under async scheduling (vLLM's default, `scheduler.async_scheduling`) the replica plans
step n+1 as step n is launched, from step n's placeholders, and applies step n when it
ends, as vLLM's engine core does with a batch queue of two; step n's tokens reach the
client after the latency model's output lag (the overlapped host work) and the
frontend's output terms (`delivery_s`, sim.config.frontend).

One event per engine step at most: a replica asks its scheduler for a plan,
holds the simulated clock for the step's predicted latency, then applies it.
A run of plain decode steps whose plans cannot change (sim/core/decode_run.py)
is one event: priced in one call, ended at the step the next arrival lands in
when that arrival could be admitted, applied and recorded in bulk, with the
same floats as step by step (`fast_forward=False`, the tests' oracle;
sim/world/fast_forward.py, Replica's base, holds that machinery). Behind
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
dropped, so memory follows the requests in flight, not the requests done.
The scheduler's KV moves (swap preemption's copies, offload-tier loads,
sim.core.kv_transfer) go on the replica's own shared links (sim.world.link_sim.KVLinks,
one per link name), so moves in flight together share a link: an async load is sent when
it is issued, and its landing is reported to the scheduler (kv_landed) and wakes the
replica; a step's sync moves are sent as it starts, the latency model prices the step
with their idle-link time, and the step ends later only by what sharing a link made them
late (the observer hears of the step's priced time, the recorders of its whole). A
replica's optional observer (sim.observe.trace.StepObserver) sees each
accepted arrival and each step just before it runs: the TTFT diagnosis and
request tracing hang there. A fleet records each step and request twice: in
its replica's recorder and in the fleet's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import simpy

from sim.config.link import Link
from sim.core.kv import KVManager
from sim.core.kv_transfer import KVTransfer
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.observe.trace import StepObserver
from sim.results.record.recorder import RunRecorder
from sim.results.record.recording import record_step
from sim.world.fast_forward import NextArrival, ReplicaFastForward, RunInProgress
from sim.world.fleet_log import (
    FleetLog,
    LogSource,
    Steps,
    after_step,
    after_timer,
    after_wake,
    after_wake_condition,
    emit_step,
)
from sim.world.link_sim import KVLinks

SCRIPTED = StepResult()  # the simulator's outputs are scripted: no token values


class ReplicaSetup(NamedTuple):
    """What one replica is built from; `kv` lets a router read its load and prefix cache.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    scheduler: Scheduler
    latency: LatencyModel
    recorder: RunRecorder
    kv: KVManager | None = None
    # speculative decoding: how many tokens each sequence of a plan emitted (the
    # acceptance process, sim.world.speculation.AcceptanceSampler); None = one per emitter
    speculate: Callable[[StepPlan], StepResult] | None = None
    observer: StepObserver | None = None  # sees each accepted arrival and step (sim.observe)
    fast_forward: bool = True  # False: every step an event (the oracle fast-forward must equal)
    # the links the scheduler's KV moves cross, by name (sim.assemble.replica_links)
    links: Mapping[str, Link] = {}


def _no_cache(_request: Request) -> int:
    return 0


@dataclass(slots=True, eq=False)
class Replica(ReplicaFastForward):
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
    # the frontend's output terms (detokenization, stream write): each token reaches the
    # client this long after it leaves the engine (sim.config.frontend)
    delivery_s: float = 0.0
    links: Mapping[str, Link] = field(default_factory=dict)  # see ReplicaSetup
    _wake: simpy.Event | None = field(default=None, init=False)
    _kv_links: KVLinks | None = field(default=None, init=False)  # made at the first KV move
    _aborts: list[int] = field(default_factory=list, init=False)  # asked during a step
    _stepping: bool = field(default=False, init=False)
    _run_arrivals: list[float] | None = field(default=None, init=False)  # during a run
    # a run's step starts and durations and how many the observer has seen, during a run
    _run_feed: list | None = field(default=None, init=False)
    _run: RunInProgress | None = field(default=None, init=False)  # during a decode run
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
    def submit(self, request: Request) -> None:
        self.catch_up()
        if not self.scheduler.add(request, self.env.now):
            self.catch_up(record=True)  # after what finished before now
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

    def wake(self) -> None:
        """Let an idle replica schedule again: blocks were freed from outside its scheduler
        (a disaggregated fleet's KV hand-off, sim.world.disaggregated)."""
        self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
            if self.fleet_log is not None:
                self._wake_no = self.fleet_log.next_wake()

    def _issue(self, take: Callable[[], tuple[KVTransfer, ...]] | None
               ) -> tuple[KVTransfer, ...]:
        """Send the async KV moves the last schedule() issued on this replica's shared links
        (each landing reaches the scheduler, then wakes the replica); returns the sync ones,
        which the plan's step sends as it starts (KVLinks.send_step)."""
        moves = take() if take is not None else ()
        return self._links().issue(moves) if moves else ()

    def _links(self) -> KVLinks:
        if self._kv_links is None:
            self._kv_links = KVLinks(self.env, self.links, self._landed)
        return self._kv_links

    def _landed(self, transfer: KVTransfer, in_flight_s: float) -> None:
        self.scheduler.kv_landed(transfer, in_flight_s)  # type: ignore[attr-defined]
        if not transfer.sync:
            self._wake_up()  # an async load's request may be admitted now

    def run(self):  # noqa: ANN201 - a SimPy process generator
        env, scheduler = self.env, self.scheduler
        # the KV moves a schedule() issued (tier loads; sim.core.kv_transfer), if it has any
        take = getattr(scheduler, "take_transfers", None)
        log = self.fleet_log
        recorders = (self.recorder,) if self.fleet_recorder is None or log is not None else (
            self.recorder, self.fleet_recorder)
        step_time = self.latency.step_time
        speculate, observer = self.speculate, self.observer
        # async scheduling (vLLM's engine core with a batch queue of two): the next step is
        # planned as this one is launched, from its placeholders, and this step's tokens leave
        # the engine output_lag_s after its GPU time (sim.latency.roofline.output_lag_s)
        overlap = bool(getattr(scheduler, "async_scheduling", False))
        output_lag = getattr(self.latency, "output_lag_s", None) if overlap else None
        ahead: StepPlan | None = None  # async: the plan made while the last step ran
        ahead_sync: tuple[KVTransfer, ...] = ()  # ... and the sync KV moves its step waits for
        delivery_s = self.delivery_s
        decode_run = scheduler.decode_run if (
            self.fast_forward and (observer is None or observer.takes_decode_runs)
            and speculate is None and (self.fleet_recorder is None or log is not None)
            and self.next_arrival is not None and not (overlap and log is not None)) else None
        while True:
            if decode_run is not None and not ahead_sync and (run := decode_run()) is not None:
                # async: the run begins with the plan made ahead and leaves the one made
                # during its last step outstanding
                yield self._begin_run(run, recorders)
                self._end_run()
                if overlap:
                    ahead = scheduler.ahead_plan()  # type: ignore[attr-defined]
                continue
            if ahead is not None:
                plan, sync, ahead, ahead_sync = ahead, ahead_sync, None, ()
            else:
                plan = scheduler.schedule(env.now)
                sync = self._issue(take)
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
            moving = None  # the step's sync KV moves (swaps, sync tier loads), if any
            if sync:
                moving = self._links().send_step(sync)
                duration_s = compute_s = step_time(plan.shape, moving.alone_s)
            else:
                duration_s = compute_s = step_time(plan.shape)
            self._stepping = True
            if observer is not None:
                observer.on_step(start_s, duration_s, plan)
            admitted = 0  # async: queued requests the next plan took (see record_step)
            if overlap:
                admitted = scheduler.num_waiting
                ahead = scheduler.schedule(env.now)
                admitted -= scheduler.num_waiting
                ahead_sync = self._issue(take)
            yield env.timeout(compute_s)
            if moving is not None:  # moves that shared a link landed late: the step waits
                late_s = yield from moving.late_s(env)
                if late_s:
                    duration_s = compute_s + late_s
                    yield env.timeout(max(0.0, start_s + duration_s - env.now))
            self._stepping = False
            result = SCRIPTED if speculate is None else speculate(plan)
            done_s = env.now + delivery_s
            if output_lag is not None:
                done_s += output_lag(plan.shape)
            finished = scheduler.on_step_done(plan, result, done_s)
            record_step(recorders, scheduler, start_s, duration_s, plan, finished, held,
                        None if speculate is None else result, admitted)
            if log is not None:
                self._log([env.now], [start_s], emit_step(
                    plan, start_s, duration_s, scheduler.num_waiting + admitted,
                    scheduler.num_running - admitted,
                    scheduler.kv_blocks_used, held, finished,
                    None if speculate is None else result))
            if finished and self.on_done is not None:
                self.on_done(len(finished))
            if self._aborts:
                self._apply_aborts()

    def _log(self, end_s: Sequence[float], start_s: Sequence[float], emit: Callable) -> None:
        """Hand steps to the fleet's log, resumed before the first as self._cause says."""
        assert self.fleet_log is not None
        steps = Steps(end_s, start_s, self._cause, emit)
        self.fleet_log.add(self._source, steps)
        self._cause = after_step(steps)
