"""The measurement window (MSER-5 from both ends), Mann-Kendall, and the 95% intervals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sim.results.stats.intervals import Interval, pooled, spread_interval, t_quantile
from sim.results.stats.steady_state import (
    batch_means,
    mann_kendall,
    measurement_window,
    mser_cut,
)


def _warm_then_flat(n_warm: int, n_flat: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    warm = 10.0 * np.exp(-np.arange(n_warm) / (n_warm / 4)) + 1.0
    return np.concatenate([warm, np.ones(n_flat)]) + rng.normal(0, 0.1, n_warm + n_flat)


def test_mser_cuts_a_warmup_transient() -> None:
    cut = mser_cut(_warm_then_flat(100, 900, seed=1))
    assert 50 <= cut <= 150 and cut % 5 == 0


def test_mser_leaves_a_stationary_series_nearly_whole() -> None:
    x = np.random.default_rng(2).normal(5.0, 1.0, 1000)
    assert mser_cut(x) < 100


def test_mser_matches_the_definition_by_brute_force() -> None:
    x = _warm_then_flat(30, 70, seed=3)
    z = x.reshape(20, 5).mean(axis=1)
    stats = [((z[d:] - z[d:].mean()) ** 2).sum() / (20 - d) ** 2 for d in range(11)]
    assert mser_cut(x) == 5 * int(np.argmin(stats))


def test_mser_never_cuts_more_than_half() -> None:
    x = np.linspace(100.0, 0.0, 200)  # a steady decline: the rule would cut everything
    assert mser_cut(x) <= 100
    assert mser_cut(np.ones(7)) == 0  # one batch: nothing to compare


def test_window_cuts_both_ends_and_counts_rejected_inside() -> None:
    n = 1000
    arrival = np.arange(n, dtype=np.float64)
    lat = _warm_then_flat(100, n - 100, seed=4)
    lat[-60:] = 0.2  # the final stretch meets an emptying system
    lat[500] = math.nan  # a rejected request in the middle
    w = measurement_window(arrival, lat)
    assert w.excluded_start >= 50 and w.excluded_end >= 50
    assert w.excluded_start + w.excluded_end + w.kept == n
    assert w.holds(np.array([500.0]))[0]
    assert w.end_s < arrival[-1]


def test_window_is_the_whole_run_when_too_short() -> None:
    w = measurement_window(np.array([0.0, 1.0]), np.array([1.0, math.nan]))
    assert (w.start_s, w.end_s, w.kept) == (0.0, 1.0, 2)


def _s_brute(x: np.ndarray) -> int:
    return sum(int(np.sign(x[j] - x[i])) for i, j in itertools.combinations(range(x.size), 2))


def test_mann_kendall_s_is_the_sum_of_pairwise_signs() -> None:
    x = np.random.default_rng(5).normal(size=30).round(1)  # ties included
    assert mann_kendall(x).s == _s_brute(x)


def test_mann_kendall_flags_an_upward_trend_and_only_that() -> None:
    rng = np.random.default_rng(6)
    noise = rng.normal(size=20)
    assert mann_kendall(noise + np.arange(20) * 0.5).upward(0.01)
    assert not mann_kendall(noise).upward(0.01)
    assert mann_kendall(-np.arange(20.0)).p_value > 0.99


def test_mann_kendall_false_alarm_rate_is_its_level() -> None:
    rng = np.random.default_rng(7)
    alarms = sum(mann_kendall(rng.normal(size=20)).upward(0.05) for _ in range(1000))
    assert 30 <= alarms <= 70  # 5% of 1000, within sampling error


def test_batch_means_average_contiguous_groups() -> None:
    np.testing.assert_allclose(batch_means(np.arange(10.0), 5), [0.5, 2.5, 4.5, 6.5, 8.5])
    np.testing.assert_allclose(batch_means(np.array([1.0, math.nan, 3.0, 5.0]), 2), [1.0, 4.0])


def test_t_interval_covers_the_true_mean_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(8)
    covered = 0
    for _ in range(2000):
        ci = spread_interval(rng.normal(2.0, 3.0, size=10))
        covered += ci.lo <= 2.0 <= ci.hi
    assert 0.935 <= covered / 2000 <= 0.965  # 95%, within 3 standard errors


def test_interval_values() -> None:
    ci = spread_interval(np.array([1.0, 2.0, 3.0]))
    assert ci.estimate == 2.0 and ci.n == 3
    assert ci.half_width == pytest.approx(t_quantile(3) * 1.0 / math.sqrt(3))
    assert t_quantile(1000) == pytest.approx(1.962, abs=1e-3)
    centred = spread_interval(np.array([1.0, 2.0, 3.0]), centre=2.5)
    assert centred.lo == pytest.approx(2.5 - ci.half_width)
    assert math.isnan(spread_interval(np.array([1.0])).half_width)
    assert pooled([Interval(1.0, 0.1, 20), Interval(3.0, 0.1, 20)]).estimate == 2.0


def test_a_share_interval_stays_in_0_1() -> None:
    ci = spread_interval(np.array([1.0, 1.0, 0.8])).clipped(0.0, 1.0)
    assert ci.hi == 1.0 and ci.lo < ci.estimate < 1.0
    assert ci.as_dict()["hi"] == 1.0


def test_in_system_counts_arrived_not_yet_left() -> None:
    from sim.results.stats.steady_state import in_system_at_arrival

    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    leave = np.array([2.5, 1.5, 2.0, 10.0])  # request 2 rejected: leaves as it arrives
    np.testing.assert_array_equal(in_system_at_arrival(arrival, leave), [0, 1, 1, 0])


def test_window_cuts_the_fill_from_empty_that_latency_does_not_show() -> None:
    # every request takes 50 s whatever the load (its own decoding): E2E latency is flat,
    # but the first 50 s of arrivals find a system still filling up from empty
    rng = np.random.default_rng(9)
    arrival = np.cumsum(rng.exponential(0.1, 3000))
    e2el = 50.0 + rng.normal(0, 1.0, 3000)
    assert measurement_window(arrival, e2el).excluded_start < 100
    w = measurement_window(arrival, e2el, arrival + e2el)
    assert w.start_s > 25.0 and w.excluded_start > 250
