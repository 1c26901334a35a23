"""Recorded requests folded in blocks against the plain per-request definitions: every
batch, sketch bucket, moment and float bit for bit; the rows' bytes; reads between folds."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.request import Request, RequestState
from sim.results.record.batches import Batch, RequestBatches
from sim.results.record.recorder import RunRecorder
from sim.results.record.requests import RequestBlock, RequestCSV
from sim.results.stats.sketch import QuantileSketch
from sim.results.stats.slo import SLO

GAMMA = (1 + 0.005) / (1 - 0.005)

# values on and beside bucket edges (gamma^k), zeros, and anything in between
values_st = st.one_of(st.floats(0.0, 1e4), st.just(0.0),
                      st.integers(-3000, 2000).map(lambda k: GAMMA ** k),
                      st.tuples(st.integers(-3000, 2000), st.sampled_from([-1, 1])).map(
                          lambda kd: math.nextafter(GAMMA ** kd[0], kd[1] * math.inf)))


@settings(max_examples=200, deadline=None)
@given(before=st.lists(values_st, max_size=20), values=st.lists(values_st, max_size=60))
def test_sketch_add_many_equals_add_one_by_one(before: list[float], values: list[float]
                                               ) -> None:
    loop, bulk = QuantileSketch(), QuantileSketch()
    for v in before:
        loop.add(v)
        bulk.add(v)
    for v in values:
        loop.add(v)
    bulk.add_many(np.array(values, dtype=np.float64))
    assert bulk.bucket_counts() == loop.bucket_counts()
    assert (bulk._offset, bytes(bulk._counts)) == (loop._offset, bytes(loop._counts))
    assert (bulk.zeros, bulk.count) == (loop.zeros, loop.count)
    assert (str(bulk.min), str(bulk.max)) == (str(loop.min), str(loop.max))


def test_sketch_add_many_refuses_negatives_and_nan() -> None:
    for bad in (-1e-3, math.nan):
        with pytest.raises(ValueError, match=">= 0"):
            QuantileSketch().add_many(np.array([1.0, bad]))


# (arrival, queue, ttft after queue, e2el after ttft, output tokens, finished)
request_st = st.tuples(st.one_of(st.floats(0, 60), st.sampled_from([0.0, 1e-3, 0.25])),
                       st.floats(0, 2), st.floats(0, 2), st.floats(0, 20),
                       st.integers(1, 4), st.booleans())


def _columns(rows: list[tuple]) -> tuple[np.ndarray, ...]:
    arrival, scheduled, token, finish, out, done = [], [], [], [], [], []
    for a, q, t, r, o, d in rows:
        arrival.append(a)
        scheduled.append(a + q if d else math.nan)
        token.append(a + q + t if d else math.nan)
        finish.append(a + q + t + r if d else math.nan)
        out.append(o)
        done.append(d)
    return (np.array(arrival), np.array(scheduled), np.array(token), np.array(finish),
            np.array(out, dtype=np.int64), np.array(done, dtype=bool))


def _state(batches: RequestBatches) -> list:
    def batch(b: Batch | None) -> object:
        if b is None:
            return None
        latency = {name: (part.sketch.bucket_counts(), part.sketch.zeros, part.sketch.count,
                          part.sketch.min, part.sketch.max, part.moments.count,
                          part.moments.mean, part.moments.m2)
                   for name, part in sorted(b.latency.items())}
        return (b.arrived, b.finished, b.good, b.arrival_sum_s, b.left, b.left_sum_s,
                b.done_here, b.good_here, latency)
    return [batches.width_s, batches.first_arrival_s, batches.last_arrival_s,
            batches.last_leave_s, [batch(b) for b in batches._batches]]


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(request_st, max_size=80), cuts=st.lists(st.integers(0, 80), max_size=4),
       max_batches=st.sampled_from([2, 4, 256]), bounded=st.booleans())
def test_batches_add_many_equals_add_one_by_one(rows: list, cuts: list[int], max_batches: int,
                                                bounded: bool) -> None:
    """In blocks cut anywhere, widening (4 batches of 1 ms: many doublings) at the same
    request, with and without an SLO: the same floats everywhere."""
    slo = SLO(ttft_ms=900.0, tpot_ms=3000.0, e2el_ms=15000.0) if bounded else None
    loop = RequestBatches(slo, max_batches=max_batches)
    bulk = RequestBatches(slo, max_batches=max_batches)
    cols = _columns(rows)
    for row in zip(*(c.tolist() for c in cols), strict=True):
        loop.add(*row)
    edges = sorted({0, len(rows), *(min(c, len(rows)) for c in cuts)})
    for lo, hi in zip(edges, edges[1:], strict=False):
        bulk.add_many(*(c[lo:hi] for c in cols))
    assert repr(_state(bulk)) == repr(_state(loop))  # repr: NaN equals NaN, -0.0 differs


def _request(i: int, arrival_s: float, out: int, finished: bool, drafted: int = 0) -> Request:
    req = Request(i, arrival_s, 5 + i % 7, out)
    if finished:
        req.state = RequestState.FINISHED
        req.first_scheduled_s = arrival_s + 0.01 * (i % 3)
        req.first_token_s = req.first_scheduled_s + 0.1 / (1 + i % 5)
        req.finish_s = req.first_token_s + 0.03 * out
        req.num_preemptions = i % 2
        req.prefix_hit_tokens = i % 4
        req.spec_drafted, req.spec_accepted = drafted, drafted // 2
    else:
        req.state = RequestState.REJECTED
        req.rejection_reason = ["too long", 'say "no", twice', None][i % 3]
    return req


def _expected_row(req: Request, reason: str | None, extra: tuple | None, width: int,
                  speculation: bool) -> list[str]:
    """The row as requests.csv defines it, cell by cell (floats as repr, never empty)."""
    def t(x: float | None) -> str:
        return "" if x is None or x != x else repr(float(x))
    row = [str(req.request_id), t(req.arrival_s), t(req.first_scheduled_s),
           t(req.first_token_s), t(req.finish_s), str(req.prompt_tokens),
           str(req.output_tokens), str(req.prefix_hit_tokens), str(req.num_preemptions)]
    if reason is None:
        a = req.arrival_s
        ttft, e2el = req.first_token_s - a, req.finish_s - a
        out = req.output_tokens
        row += [t(ttft * 1e3), t((e2el - ttft) / (out - 1) * 1e3 if out > 1 else None),
                t(e2el * 1e3), t((req.first_scheduled_s - a) * 1e3)]
    else:
        row += ["", "", "", ""]
    if speculation:
        row += [str(req.spec_drafted), str(req.spec_accepted)]
    row += ["finished", ""] if reason is None else ["rejected", reason]
    row += [""] * width if extra is None else [
        ("" if v != v else repr(v)) if isinstance(v, float) else str(v) for v in extra]
    return row


@pytest.mark.parametrize("speculation", [False, True])
@pytest.mark.parametrize("block", [1, 3, 1024])
def test_streamed_rows_and_reads_between_folds(tmp_path, speculation: bool, block: int
                                               ) -> None:
    """Rows in recording order with every cell as defined (a reason with a comma and
    quotes as csv quotes it); each read sees every request recorded before it."""
    extras = {i: (0.1 * i, math.nan, i) for i in range(0, 40, 2)}  # odd ids: no row
    path = tmp_path / "r.csv"
    rows = RequestCSV(path, speculation, ("x_ms", "y_ms", "n"), extras.get)
    rec, kept = RunRecorder(rows=rows), RunRecorder()
    rec._done = RequestBlock(speculation, block)
    kept._done = RequestBlock(True, block)
    expected = []
    for i in range(40):
        req = _request(i, 0.05 * i if i % 9 else 0, 1 + i % 4, i % 5 != 2, drafted=i % 3)
        reason = None if req.state is RequestState.FINISHED else (
            req.rejection_reason or "unknown")
        for r in (rec, kept):
            (r.record_finished if reason is None else r.record_rejected)(req)
        expected.append(_expected_row(req, reason, extras.get(i), 3, speculation))
        assert rec.num_requests == kept.num_requests == i + 1
        if i % 13 == 5:  # a read mid-run folds what is buffered
            assert len(kept.request_arrays()["request_id"]) == i + 1
            s, t = rec.summary(), kept.summary()
            assert s["completed"] + s["rejected"] == i + 1
            assert repr(s) == repr(t)
    rec.close()
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(expected)
    assert path.read_text().split("\n", 1)[1] == buf.getvalue()
    # in the order first seen (ids 2, 7, 12 of the rejected 2, 7, 12, ..., 37)
    assert list(kept.summary()["rejection_reasons"].items()) == [
        ("unknown", 3), ('say "no", twice', 3), ("too long", 2)]
    arrays = kept.request_arrays()
    assert arrays["request_id"].tolist() == list(range(40))
    assert arrays["spec_drafted"].tolist() == [i % 3 if i % 5 != 2 else 0 for i in range(40)]
