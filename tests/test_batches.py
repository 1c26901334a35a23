"""Requests in arrival-time batches: exact counts and moments, the number in the system, MSER."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.results.record.batches import RequestBatches
from sim.results.stats.sketch import DEFAULT_RELATIVE_ERROR
from sim.results.stats.slo import SLO
from sim.results.stats.steady_state import mser_cut, weighted_mser_cut

# (arrival, queue, ttft after queue, e2el after ttft, output tokens, finished)
requests = st.lists(st.tuples(st.floats(0, 500), st.floats(0, 5), st.floats(1e-3, 5),
                              st.floats(0, 50), st.integers(1, 400), st.booleans()),
                    min_size=1, max_size=120)


def _fill(rows, max_batches: int = 256, slo: SLO | None = None) -> RequestBatches:
    batches = RequestBatches(slo, max_batches=max_batches)
    for arrival, queue, ttft, rest, out, done in rows:
        first, token = arrival + queue, arrival + queue + ttft
        finish = token + rest if done else math.nan
        batches.add(arrival, first if done else math.nan, token if done else math.nan,
                    finish, out, done)
    return batches


@settings(max_examples=100, deadline=None)
@given(requests)
def test_whole_run_latency_is_exact_in_moments_and_within_bound_in_percentiles(rows) -> None:
    batches = _fill(rows)
    e2el = np.array([(a + q + t + r) - a for a, q, t, r, o, d in rows if d])  # finish - arrival
    merged = batches.latency("e2el")
    assert merged.moments.count == e2el.size
    if e2el.size:
        assert merged.moments.mean == np.float64(e2el.mean()) or math.isclose(
            merged.moments.mean, e2el.mean(), rel_tol=1e-12)
        assert math.isclose(merged.moments.std, e2el.std(), rel_tol=1e-9, abs_tol=1e-9)
        exact = np.quantile(e2el, [0.5, 0.99])
        got = merged.sketch.quantiles([0.5, 0.99])
        assert np.all(np.abs(got - exact) <= (DEFAULT_RELATIVE_ERROR + 1e-12) * exact)
    assert sum(b.arrived for b in batches.batches()) == len(rows)
    assert sum(b.done_here for b in batches.batches()) == e2el.size


@settings(max_examples=100, deadline=None)
@given(requests)
def test_narrow_batches_merge_to_what_wide_ones_hold(rows) -> None:
    # 4 batches double their width far more often than 256: the same sums and sketches
    few, many = _fill(rows, max_batches=4), _fill(rows, max_batches=256)
    ratio = few.width_s / many.width_s
    assert ratio >= 1 and ratio == 2 ** round(math.log2(ratio))
    for name in ("ttft", "e2el", "tpot", "queue"):
        a, b = few.latency(name), many.latency(name)
        assert a.sketch.bucket_counts() == b.sketch.bucket_counts()
        assert a.moments.count == b.moments.count
    k = round(ratio)
    wide = [sum(b.arrived for b in many.batches()[i:i + k])
            for i in range(0, len(many.batches()), k)]
    assert [b.arrived for b in few.batches()] == wide[:len(few.batches())]


@settings(max_examples=100, deadline=None)
@given(requests)
def test_time_average_in_system_is_the_exact_integral(rows) -> None:
    batches = _fill(rows)
    w = batches.width_s
    got = batches.in_system_means()
    for j, mean in enumerate(got):  # brute force: each request's overlap with batch j
        lo, hi = j * w, (j + 1) * w
        total = 0.0
        for a, q, t, r, _, done in rows:
            leave = a + q + t + r if done else a
            total += max(0.0, min(leave, hi) - max(a, lo))
        assert math.isclose(mean, total / w, rel_tol=1e-6, abs_tol=1e-6 * len(rows))


def test_goodput_counts_requests_meeting_every_bound() -> None:
    rows = [(0.0, 0.0, 0.1, 0.4, 5, True),  # ttft 100 ms, tpot 100 ms
            (1.0, 0.0, 0.3, 0.0, 1, True),  # ttft 300 ms: fails; no tpot
            (2.0, 0.0, 0.1, 0.0, 1, True),  # passes (one token: no TPOT)
            (3.0, 0.0, 0.1, 0.1, 2, False)]  # rejected
    batches = _fill(rows, slo=SLO(ttft_ms=200, tpot_ms=150))
    assert sum(b.good for b in batches.batches()) == 2
    assert sum(b.good_here for b in batches.batches()) == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=200))
def test_weighted_mser_with_equal_weights_is_mser_on_the_means(series) -> None:
    x = np.array(series)
    assert weighted_mser_cut(x, np.ones(x.size)) == mser_cut(x, batch=1)


def test_weighted_mser_ignores_empty_batches_and_cuts_a_transient() -> None:
    z = np.concatenate([np.linspace(50, 10, 10), np.full(40, 10.0)])
    w = np.full(z.size, 5.0)
    cut = weighted_mser_cut(z, w)
    assert 5 <= cut <= 10
    w_gaps, z_gaps = w.copy(), z.copy()
    w_gaps[20:30], z_gaps[20:30] = 0.0, np.nan  # batches nobody finished in
    assert weighted_mser_cut(z_gaps, w_gaps) == cut


@settings(max_examples=100, deadline=None)
@given(requests, st.integers(1, 25))
def test_a_window_merged_from_its_groups_is_the_window_merged_batch_by_batch(rows, k) -> None:
    # sim.results.files.steady merges the window's sketches from its groups' (one merge a group):
    # the same buckets, count, zeros, min and max, and the moments float for float
    from sim.results.files.steady import _whole

    batches = _fill(rows)
    window = batches.batches()
    groups = [[window[i] for i in ix]
              for ix in np.array_split(np.arange(len(window)), min(k, len(window)))]
    for name in ("ttft", "tpot", "e2el", "queue"):
        direct = batches.latency(name, window)
        whole = _whole([batches.latency(name, g) for g in groups], window, name)
        a, b = direct.sketch, whole.sketch
        assert a.bucket_counts() == b.bucket_counts()
        assert (a.count, a.zeros, a.min, a.max) == (b.count, b.zeros, b.min, b.max)
        assert np.array_equal(a.quantiles([0.5, 0.9, 0.99]), b.quantiles([0.5, 0.9, 0.99]),
                              equal_nan=True)
        m, n = direct.moments, whole.moments
        assert (m.count, m.mean, m.m2) == (n.count, n.mean, n.m2)
