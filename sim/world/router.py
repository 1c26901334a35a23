"""Routers: which replica of a fleet serves each arriving request.

A router sees each replica at the arrival instant through `ReplicaView`
(outstanding requests, KV load, cached prefix of this request) and returns an
index. Randomised policies draw from the generator the world passes in, which
`router_rng` seeds from the scenario seed on a stream of its own, so a run is
deterministic per seed and routing never perturbs the workload's draws.
Stateful policies (round-robin's cursor) keep their state on the instance.

Ties among equally loaded replicas go round-robin (a rotating start), not to
replica 0: at low load every replica is idle, and "lowest index wins" would
pile the whole trickle onto one replica.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import ClassVar, Protocol

import numpy as np

from sim.core.request import Request

ROUTER_STREAM = 0x524F555445  # "ROUTE": the router's seed stream, apart from the workload's
DEFAULT_LOAD_LIMIT = 1.5


class ReplicaView(Protocol):
    """What a router may read about one replica, at the arrival instant."""

    @property
    def num_outstanding(self) -> int:
        """Requests queued or running (waiting + running), the new arrival excluded."""
        ...

    @property
    def kv_load(self) -> float:
        """KV blocks used / usable blocks, in [0, 1]."""
        ...

    def cached_prefix_tokens(self, request: Request) -> int:
        """Prompt tokens of `request` this replica's prefix cache would serve (0: none)."""
        ...


class Router(Protocol):
    """`reads_kv`: whether choose() reads kv_load or cached_prefix_tokens (a router without
    it is taken to). Such a router reads KV that a decode run in progress has not applied,
    so its replicas run step by step; one reading only num_outstanding gets replicas
    that fast-forward, their running sets caught up before each arrival."""

    def choose(self, request: Request, replicas: Sequence[ReplicaView],
               rng: np.random.Generator) -> int: ...


def router_rng(seed: int) -> np.random.Generator:
    """The router's generator: a function of the scenario seed only."""
    return np.random.default_rng([seed, ROUTER_STREAM])


def _argmin_rotating(keys: Sequence[float | tuple[float, ...]], start: int) -> int:
    """Index of the smallest key; among equals, the first at or after `start` (cyclically)."""
    n = len(keys)
    best = start % n
    best_key = keys[best]
    for step in range(1, n):
        i = (start + step) % n
        if keys[i] < best_key:
            best, best_key = i, keys[i]
    return best


class RoundRobin:
    """Replica 0, 1, ..., N-1, 0, ...: blind to load, the baseline."""

    reads_kv: ClassVar[bool] = False  # see Router.reads_kv
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView],
               rng: np.random.Generator) -> int:
        i = self._next % len(replicas)
        self._next = i + 1
        return i


class LeastOutstanding:
    """Fewest waiting + running requests (ties round-robin)."""

    reads_kv: ClassVar[bool] = False  # see Router.reads_kv
    __slots__ = ("_turn",)

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView],
               rng: np.random.Generator) -> int:
        self._turn += 1
        return _argmin_rotating([r.num_outstanding for r in replicas], self._turn)


class LeastKV:
    """Lowest KV-block occupancy; ties by outstanding requests, then round-robin."""

    reads_kv: ClassVar[bool] = True
    __slots__ = ("_turn",)

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView],
               rng: np.random.Generator) -> int:
        self._turn += 1
        return _argmin_rotating([(r.kv_load, r.num_outstanding) for r in replicas], self._turn)


class PowerOfTwo:
    """Two distinct replicas drawn uniformly; the one with fewer outstanding (Mitzenmacher).

    Near least-outstanding balance while reading only two replicas' state, as a
    distributed front end would. Ties go to the first drawn (already random).
    """

    reads_kv: ClassVar[bool] = False  # see Router.reads_kv
    __slots__ = ()

    def choose(self, request: Request, replicas: Sequence[ReplicaView],
               rng: np.random.Generator) -> int:
        n = len(replicas)
        if n == 1:
            return 0
        a = int(rng.integers(n))
        b = int(rng.integers(n - 1))
        b += b >= a  # distinct from a, uniform over the other n - 1
        return b if replicas[b].num_outstanding < replicas[a].num_outstanding else a


class PrefixAware:
    """The longest cached prefix of the request, among replicas not overloaded.

    Eligible: outstanding <= load_limit x (fleet mean outstanding) + 1. The
    least-loaded replica is always eligible (min <= mean, load_limit >= 1), so
    the set is never empty, and a replica that takes the request ends with at
    most load_limit x mean + 2 outstanding: one hot prefix cannot swamp it.
    The + 1 lets a replica run one request ahead at low load, where the mean
    is a fraction and an integer count would otherwise never pass. Among the
    eligible, most cached tokens wins; ties go to fewer outstanding, then
    round-robin, so with no cache hits this is least-outstanding routing.
    """

    reads_kv: ClassVar[bool] = True
    __slots__ = ("load_limit", "_turn")

    def __init__(self, load_limit: float = DEFAULT_LOAD_LIMIT) -> None:
        if not load_limit >= 1.0:
            raise ValueError(f"load_limit must be >= 1 so the least-loaded replica is always "
                             f"eligible, got {load_limit}")
        self.load_limit = load_limit
        self._turn = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView],
               rng: np.random.Generator) -> int:
        self._turn += 1
        loads = [r.num_outstanding for r in replicas]
        bound = self.load_limit * sum(loads) / len(loads) + 1
        # minimise (-cached, outstanding); ineligible replicas rank last
        keys = [(-r.cached_prefix_tokens(request), load) if load <= bound else (1, load)
                for r, load in zip(replicas, loads, strict=True)]
        return _argmin_rotating(keys, self._turn)


POLICIES: MappingProxyType[str, Callable[[float], Router]] = MappingProxyType({
    "round_robin": lambda _limit: RoundRobin(),
    "least_outstanding": lambda _limit: LeastOutstanding(),
    "least_kv": lambda _limit: LeastKV(),
    "power_of_two": lambda _limit: PowerOfTwo(),
    "prefix_aware": PrefixAware,
})


def build_router(policy: str, load_limit: float = DEFAULT_LOAD_LIMIT) -> Router:
    """A fresh router (its own cursor) for one run."""
    try:
        make = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown router policy {policy!r}; choose from "
                         f"{', '.join(POLICIES)}") from None
    return make(load_limit)
