"""Running a disaggregated fleet (sim.world.disaggregated): its replicas built from setups,
each behind a PoolTap (sim.world.tap), arrivals through the fleet's arrival process
(sim.world.fleet), one SharedLink between the pools (sim.world.link_sim).

Each arrival is kept as the original request and a one-token copy of it goes to the
prefill instance the router picks; the original continues on a decode instance once its
KV has landed. A rejection records the original (its full output).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import simpy

from sim.config.frontend import Frontend
from sim.config.link import Link
from sim.core.request import Request
from sim.results.record.recorder import RunRecorder
from sim.world.disaggregated import DisaggregatedFleet, HandoffStats
from sim.world.fast_forward import NextArrival
from sim.world.fleet import _arrivals
from sim.world.link_sim import SharedLink
from sim.world.replica import Replica, ReplicaSetup
from sim.world.router import Router
from sim.world.tap import PoolTap


def simulate_disaggregated(requests: Iterable[Request], prefill: Sequence[ReplicaSetup],
                           decode: Sequence[ReplicaSetup], prefill_router: Router,
                           decode_router: Router, rng: np.random.Generator, link: Link,
                           fleet_recorder: RunRecorder, pool_recorders: tuple[RunRecorder,
                                                                              RunRecorder],
                           shard_bytes_per_token: float, num_layers: int, layerwise: bool,
                           on_done: Callable[[int], None] | None = None,
                           frontend: Frontend | None = None,
                           on_event: Callable[[DisaggregatedFleet], None] | None = None
                           ) -> tuple[float, HandoffStats]:
    """Run a disaggregated fleet to completion; returns the end time and the hand-off costs.

    Each setup's recorder is that replica's own; steps also go to its pool's recorder
    (`pool_recorders`: prefill, decode) and to `fleet_recorder`, which records each
    request once, when it is done. `on_event`: called after each step (tests' checks)."""
    env = simpy.Environment()
    delivery_s = 0.0 if frontend is None else (frontend.detokenize_s_per_token
                                               + frontend.stream_s_per_token)
    fleet = DisaggregatedFleet(env, [], [], SharedLink(env, link), decode_router, rng,
                               fleet_recorder, shard_bytes_per_token, num_layers, layerwise,
                               on_done)
    originals: dict[int, Request] = {}
    for side, setups, pool in (("prefill", prefill, pool_recorders[0]),
                               ("decode", decode, pool_recorders[1])):
        for i, s in enumerate(setups):
            tap = PoolTap((s.recorder, pool), fleet_recorder)
            if side == "prefill":
                tap.finished = (lambda req, i=i, tap=tap: fleet.prefilled(
                    i, req, originals.pop(req.request_id), tap.last_step_s))
            else:
                tap.finished = fleet.decoded
                tap.stepped = (lambda plan, i=i: fleet.decode_step(i, plan, delivery_s))
            tap.rejected = (lambda req: _rejected(originals, req, on_done))
            if on_event is not None:
                tap.after = lambda: on_event(fleet)
            replica = Replica(env, s.scheduler, s.latency, tap, None, s.kv, None, s.speculate,
                              s.observer, False, None, None, delivery_s,  # type: ignore[arg-type]
                              s.links)
            fleet.add(side, replica)
    for replica in fleet.prefill + fleet.decode:
        env.process(replica.run())
    entry = _Entry(fleet, prefill_router, rng, originals)
    env.process(_arrivals(env, requests, lambda _r: entry, [entry], NextArrival(), None,
                          frontend))  # type: ignore[list-item]
    env.run()
    fleet.stats.link_busy_s = fleet.link.busy_s
    return float(env.now), fleet.stats


class _Entry:
    """What the arrival process submits to: a one-token copy to a prefill instance."""

    def __init__(self, fleet: DisaggregatedFleet, router: Router, rng: np.random.Generator,
                 originals: dict[int, Request]) -> None:
        self.fleet, self.router, self.rng, self.originals = fleet, router, rng, originals

    def submit(self, request: Request) -> None:
        self.originals[request.request_id] = request
        prefill = self.fleet.prefill
        prefill[self.router.choose(request, prefill, self.rng)].submit(
            request.rescripted(request.arrival_s, 1))

    def catch_up(self) -> None:
        return None

    def close(self) -> None:
        for replica in self.fleet.prefill:
            replica.close()
        self.fleet.arrivals_done()


def _rejected(originals: dict[int, Request], request: Request,
              on_done: Callable[[int], None] | None) -> Request:
    """The request a rejection records: the original (its full output), not the prefill's
    one-token copy."""
    original = originals.pop(request.request_id, None)
    if on_done is not None:
        on_done(1)
    if original is None:
        return request
    original.reject(request.rejection_reason or "unknown", request.finish_s or 0.0)
    return original


def percentiles_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """mean, p50 and p99 of `samples_s`, in ms (NaN when empty)."""
    if not samples_s:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan}
    values = np.asarray(samples_s) * 1e3
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p99": float(np.percentile(values, 99))}
