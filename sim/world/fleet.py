"""The SimPy world's fleet: an arrival process feeding replicas through a router.

Each arrival asks the router for a replica at its arrival instant, so the
router sees every replica's queue and KV as they are then (arrivals at the
same instant see the ones routed before them). After the last arrival every
scheduler is closed (no more requests will come) and idle replicas are woken,
so static batching launches its short last batch. One replica never calls the
router and records once, so its hot loop is the single-replica loop it always was.
Several replicas fast-forward behind the router (sim.world.replica): their steps
reach the fleet's recorder through a FleetLog, in step by step's order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import simpy

from sim.config.frontend import Frontend
from sim.config.link import Link
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.observe.trace import StepObserver
from sim.results.record.recorder import RunRecorder
from sim.world.fast_forward import NextArrival
from sim.world.fleet_log import FleetLog
from sim.world.replica import Replica, ReplicaSetup
from sim.world.router import Router


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
              route: Callable[[Request], Replica], replicas: Sequence[Replica],
              next_arrival: NextArrival, log: FleetLog | None,
              frontend: Frontend | None):  # noqa: ANN202
    for request in requests:
        # the engine gets a request after the frontend's API server and tokenizer (never
        # before an earlier request: a shorter prompt right behind a long one waits for it)
        at_s = request.arrival_s if frontend is None else (
            request.arrival_s + frontend.api_server_s
            + frontend.tokenize_s_per_token * request.prompt_tokens)
        next_arrival.at_s = at_s
        delay_s = at_s - env.now
        if delay_s > 0:
            yield _Arrival(env, delay_s)
        if log is not None:
            for replica in replicas:  # the router reads caught-up running sets
                replica.catch_up()
            log.flush(env.now)
        route(request).submit(request)
    next_arrival.at_s = math.inf
    for replica in replicas:
        replica.close()


def simulate_fleet(requests: Iterable[Request], setups: Sequence[ReplicaSetup],
                   router: Router | None, rng: np.random.Generator | None,
                   fleet_recorder: RunRecorder,
                   on_done: Callable[[int], None] | None = None,
                   frontend: Frontend | None = None) -> float:
    """Run replicas behind `router` to completion; returns the simulated end time in seconds.

    Every request and step goes to its replica's recorder and to `fleet_recorder`
    (once, when a replica's recorder is the fleet's). One replica skips the router.
    `frontend` (sim.config.frontend): requests reach the engine after its input terms,
    and tokens the client after its output terms, so every recorded time is the
    client's (None: the engine's own, as the real engine's replay records them).
    """
    if not setups:
        raise ValueError("a fleet needs at least one replica")
    env = simpy.Environment()
    next_arrival = NextArrival()
    # behind a router that reads only running sets, the fleet's recorder takes the steps
    # in step by step's order from a log when some replica fast-forwards; one reading KV
    # (Router.reads_kv) gets every replica step by step, recording in order as it goes
    log = FleetLog(fleet_recorder) if len(setups) > 1 and any(
        s.fast_forward for s in setups) and not getattr(router, "reads_kv", True) else None
    replicas = [Replica(env, s.scheduler, s.latency, s.recorder, on_done, s.kv,
                        None if s.recorder is fleet_recorder else fleet_recorder, s.speculate,
                        s.observer, s.fast_forward, next_arrival, log,
                        frontend.detokenize_s_per_token + frontend.stream_s_per_token
                        if frontend is not None else 0.0, s.links)
                for s in setups]
    for replica in replicas:
        env.process(replica.run())
    if len(replicas) == 1:
        only = replicas[0]

        def route(_request: Request) -> Replica:
            return only
    else:
        if router is None or rng is None:
            raise ValueError("several replicas need a router and an rng")
        choose = router.choose

        def route(request: Request) -> Replica:
            return replicas[choose(request, replicas, rng)]
    env.process(_arrivals(env, requests, route, replicas, next_arrival, log, frontend))
    env.run()
    if log is not None:
        log.flush(math.inf)
    return float(env.now)


def simulate(requests: Iterable[Request], scheduler: Scheduler, latency: LatencyModel,
             recorder: RunRecorder, on_done: Callable[[int], None] | None = None,
             observer: StepObserver | None = None, fast_forward: bool = True,
             frontend: Frontend | None = None, links: Mapping[str, Link] | None = None
             ) -> float:
    """Run one replica to completion; returns the simulated end time in seconds.

    `fast_forward=False` spends an event on every step (the oracle for the default);
    `frontend`: see simulate_fleet; `links`: what the scheduler's KV moves cross, by name
    (sim.assemble.replica_links: swaps and tier loads need "host")."""
    setup = ReplicaSetup(scheduler, latency, recorder, observer=observer,
                         fast_forward=fast_forward, links=links or {})
    # one replica never consults the router, so neither a router nor an rng is needed
    return simulate_fleet(requests, [setup], None, None, recorder, on_done, frontend)
