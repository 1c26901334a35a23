"""The quantile sketch: within its stated relative error of numpy, mergeable exactly, bounded."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.results.stats.sketch import DEFAULT_RELATIVE_ERROR, QuantileSketch

QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)
# samples a latency can be: zero, or 1 ns to a day
latencies = st.one_of(st.just(0.0), st.floats(1e-9, 86_400.0, allow_nan=False))
ROUNDING = 1e-12  # log's last bits can put a value a hair across a bucket boundary


def sketch_of(values: list[float], a: float = DEFAULT_RELATIVE_ERROR) -> QuantileSketch:
    sketch = QuantileSketch(a)
    sketch.add_all(values)
    return sketch


@settings(max_examples=200, deadline=None)
@given(st.lists(latencies, min_size=1, max_size=400),
       st.sampled_from([0.001, 0.005, 0.02, 0.1]))
def test_every_quantile_is_within_the_relative_error_of_numpys(values, a) -> None:
    exact = np.quantile(np.array(values), QS)  # method 'linear', as the sketch states
    got = sketch_of(values, a).quantiles(QS)
    assert np.all(np.abs(got - exact) <= (a + ROUNDING) * exact)


def test_the_bound_is_tight_not_loose() -> None:
    # a log-uniform sample fills every bucket, so some quantile sits near a bucket's edge
    rng = np.random.default_rng(1)
    values = np.exp(rng.uniform(math.log(1e-3), math.log(10.0), 20_000))
    qs = np.linspace(0.001, 0.999, 999)
    got, exact = sketch_of(values.tolist()).quantiles(qs), np.quantile(values, qs)
    worst = float(np.max(np.abs(got / exact - 1)))
    assert DEFAULT_RELATIVE_ERROR / 2 < worst <= DEFAULT_RELATIVE_ERROR + ROUNDING


@settings(max_examples=200, deadline=None)
@given(st.lists(latencies, max_size=200), st.lists(latencies, max_size=200))
def test_merge_equals_one_sketch_of_both(a, b) -> None:
    left, right, whole = sketch_of(a), sketch_of(b), sketch_of(a + b)
    merged = QuantileSketch.merged([left, right])
    assert merged.bucket_counts() == whole.bucket_counts()
    assert (merged.count, merged.zeros) == (whole.count, whole.zeros)
    assert (merged.min, merged.max) == (whole.min, whole.max) or not whole.count
    np.testing.assert_array_equal(merged.quantiles(QS), whole.quantiles(QS))


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-6, 1.0), st.floats(1.0, 1e6), st.integers(1, 5000), st.integers(0, 2**32))
def test_buckets_are_bounded_by_the_value_range_not_the_count(lo, span, n, seed) -> None:
    a = DEFAULT_RELATIVE_ERROR
    rng = np.random.default_rng(seed)
    values = lo * span ** rng.uniform(0, 1, n)
    sketch = sketch_of(values.tolist(), a)
    bound = math.ceil(math.log(span) / math.log((1 + a) / (1 - a))) + 1
    assert sketch.num_buckets <= min(bound, n)


def test_a_million_samples_in_a_few_thousand_buckets() -> None:
    rng = np.random.default_rng(0)
    sketch = sketch_of(rng.lognormal(-2.0, 1.5, 1_000_000).tolist())
    assert sketch.count == 1_000_000
    assert sketch.num_buckets < 2_303  # the docstring's 1 us .. 1e4 s figure


def test_empty_sketch_gives_nan_and_negatives_are_refused() -> None:
    assert np.isnan(QuantileSketch().quantiles([0.5])).all()
    with pytest.raises(ValueError, match=">= 0"):
        QuantileSketch().add(-1e-3)
    with pytest.raises(ValueError, match="relative error"):
        QuantileSketch(0.01).update(QuantileSketch(0.02))
