"""Routers on their own: each policy's rule, checked on replicas built to order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import get_args

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.config.sections import RouterConfig
from sim.core.request import Request
from sim.world.router import (
    POLICIES,
    LeastOutstanding,
    PowerOfTwo,
    PrefixAware,
    RoundRobin,
    build_router,
    router_rng,
)


@dataclass
class View:
    """A replica as a router sees it; logs which replicas the router looked at."""

    num_outstanding: int = 0
    kv_load: float = 0.0
    cached: int = 0
    reads: list[int] = field(default_factory=list)
    index: int = 0

    def __getattribute__(self, name: str):  # noqa: ANN204 - test spy
        if name == "num_outstanding":
            object.__getattribute__(self, "reads").append(object.__getattribute__(self, "index"))
        return object.__getattribute__(self, name)

    def cached_prefix_tokens(self, request: Request) -> int:
        return self.cached


def views(loads: Sequence[int], cached: Sequence[int] | None = None) -> list[View]:
    cached = cached or [0] * len(loads)
    return [View(num_outstanding=n, cached=c, index=i)
            for i, (n, c) in enumerate(zip(loads, cached, strict=True))]


REQ = Request(0, 0.0, 16, 1)


def test_scenario_router_choices_are_the_registry() -> None:
    literal = RouterConfig.model_fields["policy"].annotation
    assert set(get_args(literal)) == set(POLICIES)
    with pytest.raises(ValueError, match="unknown router policy 'nope'"):
        build_router("nope")


@given(st.integers(1, 9), st.integers(0, 200))
def test_round_robin_counts_differ_by_at_most_one(n: int, m: int) -> None:
    router, replicas, rng = RoundRobin(), views([0] * n), router_rng(0)
    counts = np.bincount([router.choose(REQ, replicas, rng) for _ in range(m)], minlength=n)
    assert counts.max() - counts.min() <= 1


@given(st.lists(st.integers(0, 5), min_size=1, max_size=8), st.integers(0, 20))
def test_least_outstanding_takes_a_minimum(loads: list[int], turns: int) -> None:
    router = LeastOutstanding()
    for _ in range(turns):
        router.choose(REQ, views(loads), router_rng(0))
    assert loads[router.choose(REQ, views(loads), router_rng(0))] == min(loads)


def test_least_outstanding_spreads_ties_instead_of_piling_on_replica_0() -> None:
    router, idle = LeastOutstanding(), views([0, 0, 0])
    assert sorted(router.choose(REQ, idle, router_rng(0)) for _ in range(3)) == [0, 1, 2]


@given(st.lists(st.integers(0, 9), min_size=2, max_size=8), st.integers(0, 2**32 - 1))
def test_power_of_two_reads_two_distinct_replicas_and_takes_the_lighter(
        loads: list[int], seed: int) -> None:
    replicas = views(loads)
    chosen = PowerOfTwo().choose(REQ, replicas, np.random.default_rng(seed))
    looked = {i for r in replicas for i in r.reads}
    assert len(looked) == 2 and chosen in looked
    assert loads[chosen] == min(loads[i] for i in looked)


def test_power_of_two_pairs_are_uniform_over_distinct_replicas() -> None:
    rng, counts = np.random.default_rng(1), np.zeros(4, dtype=int)
    for _ in range(4000):
        replicas = views([0, 0, 0, 0])
        PowerOfTwo().choose(REQ, replicas, rng)
        looked = [i for r in replicas for i in r.reads]
        assert len(set(looked)) == 2
        counts[list(set(looked))] += 1
    assert counts.min() > 0.9 * 2000 and counts.max() < 1.1 * 2000  # each in half the pairs


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 4)), min_size=1, max_size=8),
       st.floats(1.0, 3.0))
def test_prefix_aware_takes_the_longest_cached_prefix_within_the_load_bound(
        spec: list[tuple[int, int]], limit: float) -> None:
    loads, cached = [s[0] for s in spec], [s[1] * 16 for s in spec]
    chosen = PrefixAware(limit).choose(REQ, views(loads, cached), router_rng(0))
    bound = limit * sum(loads) / len(loads) + 1
    eligible = [i for i, n in enumerate(loads) if n <= bound]
    assert chosen in eligible
    assert cached[chosen] == max(cached[i] for i in eligible)
    assert loads[chosen] == min(loads[i] for i in eligible if cached[i] == cached[chosen])


def test_prefix_aware_skips_an_overloaded_replica_holding_the_prefix() -> None:
    # mean 4, bound 1.5 x 4 + 1 = 7: replica 0 (10 outstanding) is out despite its cache
    assert PrefixAware(1.5).choose(REQ, views([10, 2, 0, 4], [512, 0, 0, 256]),
                                   router_rng(0)) == 3
    with pytest.raises(ValueError, match="load_limit must be >= 1"):
        PrefixAware(0.5)


