"""Data-parallel attention ranks in lockstep: the SimPy world of one DP x EP replica.

N ranks, each its own scheduler and KV pool (the same classes as a replica's, so each
rank decides as vLLM's engine core does: parity holds per rank), behind a front router
(sim.world.router, the fleet's policies) that places each arriving request on one rank.
As vLLM's DP engines do, every rank runs every step: the MoE layers' all-to-alls need
all GPUs, so a rank with nothing scheduled runs a dummy batch, and a step lasts as long
as the slowest rank plus the MoE layers (sim.latency.moe_dp_ep.DPEPGroupLatency). The
group waits only when no rank has anything to run.

Each rank's steps go to its recorder and the group's, as a fleet's replicas' do; the
lockstep steps themselves (each rank's batch, tokens and own time) go to the group's
LockstepLog (sim.world.dp_log), which the time series and summary read. Step by step,
always: no decode run is fast-forwarded (the ranks' runs would have to end together).
Under async scheduling each rank plans its next step as this one launches, as a replica
does. Each rank's KV moves (swaps, offload-tier loads) go on its own shared links, as a
replica's do; a rank's sync moves are priced in its own time (the lockstep's slowest rank
may be it), and a rank whose moves a shared link made late holds the whole step that long
(an upper bound when that rank is not the slowest).
Aborts are not modelled (the group serves the simulator, not `servesim serve`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.config.frontend import Frontend
from sim.core.kv_transfer import KVTransfer
from sim.core.plan import StepPlan
from sim.core.request import Request
from sim.latency.moe_dp_ep import DPEPGroupLatency
from sim.results.record.recorder import RunRecorder
from sim.results.record.recording import record_step
from sim.world.dp_log import LockstepLog
from sim.world.fast_forward import NextArrival
from sim.world.fleet import _arrivals  # the fleet's arrival process, fed ranks instead
from sim.world.link_sim import KVLinks
from sim.world.replica import SCRIPTED, ReplicaSetup
from sim.world.router import Router


@dataclass(slots=True, eq=False)
class Rank:
    """One attention rank as the front router sees it (sim.world.router.ReplicaView) and as
    the fleet's arrival process feeds it."""

    setup: ReplicaSetup
    group: DPGroup
    fleet_recorder: RunRecorder | None
    kv_links: KVLinks | None = None  # the rank's links for its KV moves (made on first use)

    @property
    def num_outstanding(self) -> int:
        s = self.setup.scheduler
        return s.num_waiting + s.num_running

    @property
    def kv_load(self) -> float:
        kv = self.setup.kv
        usable = kv.num_usable_blocks if kv is not None else 0
        return self.setup.scheduler.kv_blocks_used / usable if usable else 0.0

    def cached_prefix_tokens(self, request: Request) -> int:
        kv = self.setup.kv
        return kv.cached_prefix_tokens(request) if kv is not None else 0

    def catch_up(self) -> None:
        """Nothing to catch up: the group runs step by step."""

    def submit(self, request: Request) -> None:
        now = self.group.env.now
        if not self.setup.scheduler.add(request, now):
            for recorder in self.recorders():
                recorder.record_rejected(request)
            self.group.done(1)
            return
        if self.setup.observer is not None:
            self.setup.observer.on_arrival(request, now)
        self.group.wake()

    def close(self) -> None:
        self.setup.scheduler.close(self.group.env.now)
        self.group.wake()

    def issue(self) -> tuple[KVTransfer, ...]:
        """Send the async KV moves the rank's last schedule() issued on its links; returns
        the sync ones, which the group's step sends as it starts (as a replica's)."""
        take = getattr(self.setup.scheduler, "take_transfers", None)
        moves = take() if take is not None else ()
        return self.links().issue(moves) if moves else ()

    def links(self) -> KVLinks:
        if self.kv_links is None:
            self.kv_links = KVLinks(self.group.env, self.setup.links, self._landed)
        return self.kv_links

    def _landed(self, transfer: KVTransfer, in_flight_s: float) -> None:
        self.setup.scheduler.kv_landed(transfer, in_flight_s)  # type: ignore[attr-defined]
        if not transfer.sync:
            self.group.wake()

    def recorders(self) -> tuple[RunRecorder, ...]:
        own = self.setup.recorder
        return (own,) if self.fleet_recorder is None or self.fleet_recorder is own else (
            own, self.fleet_recorder)


@dataclass(slots=True, eq=False)
class DPGroup:
    """The ranks' one SimPy process: plan every rank, hold the lockstep step, apply."""

    env: simpy.Environment
    latency: DPEPGroupLatency
    log: LockstepLog
    on_done: Callable[[int], None] | None = None
    delivery_s: float = 0.0  # the frontend's output terms (sim.config.frontend)
    ranks: list[Rank] = field(default_factory=list)
    _wake: simpy.Event | None = None

    def wake(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def done(self, count: int) -> None:
        if count and self.on_done is not None:
            self.on_done(count)

    def run(self):  # noqa: ANN201 - a SimPy process generator
        env, latency, ranks = self.env, self.latency, self.ranks
        schedulers = [r.setup.scheduler for r in ranks]
        overlap = any(getattr(s, "async_scheduling", False) for s in schedulers)
        ahead: list[StepPlan | None] = [None] * len(ranks)
        no_moves: tuple[KVTransfer, ...] = ()
        ahead_sync = [no_moves] * len(ranks)  # the sync KV moves of each ahead plan
        while True:
            plans: list[StepPlan | None] = []
            sync: list[tuple[int, tuple[KVTransfer, ...]]] = []  # each rank's, if any
            for i, (rank, a, moves) in enumerate(zip(ranks, ahead, ahead_sync, strict=True)):
                if a is None:
                    a, moves = rank.setup.scheduler.schedule(env.now), rank.issue()
                plans.append(a)
                if moves:
                    sync.append((i, moves))
            ahead = [None] * len(ranks)
            ahead_sync = [no_moves] * len(ranks)
            if all(p is None for p in plans):
                yield from self._idle(schedulers)
                continue
            start_s = env.now
            held = [s.kv_slots_held for s in schedulers]
            shapes = [None if p is None else p.shape for p in plans]
            # each rank's sync KV moves (swaps, sync tier loads), priced in its own time
            moving = [ranks[i].links().send_step(moves) for i, moves in sync]
            if moving:
                moved_s = [0.0] * len(ranks)
                for (i, _moves), step in zip(sync, moving, strict=True):
                    moved_s[i] = step.alone_s
                duration_s, rank_s = latency.lockstep(shapes, moved_s)
            else:
                duration_s, rank_s = latency.lockstep(shapes)
            compute_s = duration_s
            admitted = [0] * len(ranks)
            for i, (rank, plan) in enumerate(zip(ranks, plans, strict=True)):
                if plan is None:
                    continue
                if rank.setup.observer is not None:
                    rank.setup.observer.on_step(start_s, duration_s, plan)
                if overlap:  # plan the next step as this one launches
                    admitted[i] = schedulers[i].num_waiting
                    ahead[i] = schedulers[i].schedule(env.now)
                    admitted[i] -= schedulers[i].num_waiting
                    ahead_sync[i] = rank.issue()
            yield env.timeout(compute_s)
            late_s = 0.0  # moves that shared a link landed late: the group waits (the most)
            for step in moving:
                late_s = max(late_s, (yield from step.late_s(env)))
            if late_s:
                duration_s = compute_s + late_s
                yield env.timeout(max(0.0, start_s + duration_s - env.now))
            self.log.add(start_s, duration_s,
                         [0 if p is None else len(p.request_ids) for p in plans],
                         [0 if p is None else p.shape.num_tokens for p in plans], rank_s)
            for i, (rank, plan) in enumerate(zip(ranks, plans, strict=True)):
                if plan is None:
                    continue
                done_s = env.now + self.delivery_s
                if overlap:
                    done_s += latency.output_lag_s(plan.shape)
                finished = schedulers[i].on_step_done(plan, SCRIPTED, done_s)
                record_step(rank.recorders(), schedulers[i], start_s, duration_s, plan,
                            finished, held[i], None, admitted[i])
                self.done(len(finished))

    def _idle(self, schedulers: Sequence):  # noqa: ANN202 - a SimPy process generator
        """Wait for an arrival (a rank's wake) or the earliest rank timer."""
        env = self.env
        self._wake = env.event()
        timers = [t for s in schedulers if (t := s.next_wakeup(env.now)) is not None]
        if timers:
            yield self._wake | env.timeout(max(0.0, min(timers) - env.now))
        else:
            yield self._wake
        self._wake = None


def simulate_dp_group(requests: Iterable[Request], setups: Sequence[ReplicaSetup],
                      latency: DPEPGroupLatency, router: Router, rng: np.random.Generator,
                      fleet_recorder: RunRecorder, log: LockstepLog,
                      on_done: Callable[[int], None] | None = None,
                      frontend: Frontend | None = None) -> float:
    """Run `setups` (one per rank) in lockstep behind `router`; returns the simulated end
    time in seconds. Requests and steps go to each rank's recorder and `fleet_recorder`;
    the lockstep steps to `log`. `frontend`: as sim.world.fleet.simulate_fleet."""
    if len(setups) != latency.dp:
        raise ValueError(f"{latency.dp} ranks need {latency.dp} setups, got {len(setups)}")
    env = simpy.Environment()
    group = DPGroup(env, latency, log, on_done,
                    frontend.detokenize_s_per_token + frontend.stream_s_per_token
                    if frontend is not None else 0.0)
    group.ranks = [Rank(s, group, fleet_recorder) for s in setups]
    choose, ranks = router.choose, group.ranks

    def route(request: Request) -> Rank:
        return ranks[choose(request, ranks, rng)]

    next_arrival = NextArrival()
    env.process(group.run())
    env.process(_arrivals(env, requests, route, ranks, next_arrival, None, frontend))
    env.run()
    return float(env.now)
