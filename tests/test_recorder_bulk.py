"""The recorder's bulk folding (buffered steps, numpy over many at once) against a plain
per-step loop: every bin, count and float bit for bit, on random steps and decode runs."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.decode_run import DecodeRun
from sim.core.plan import StepPlan, StepShape, checked_plan
from sim.results.record.itl_slices import ITLSlices
from sim.results.record.recorder import RunRecorder
from sim.results.record.step_buffer import StepBuffer
from sim.results.record.time_buckets import TimeBuckets
from sim.results.stats.inorder import EDGE, add_in_order, floor_log, sum_rows
from sim.results.stats.percentiles import LogHistogram

_SCALE = 1.0 / math.log1p(1e-3)


class LoopRecorder:
    """What the recorder folds, one step at a time with the accumulators' scalar add()."""

    def __init__(self) -> None:
        self.itl = LogHistogram()
        self.slices = ITLSlices(max_slices=4, width_s=0.05)
        self.series = TimeBuckets(max_buckets=4, width_s=0.01)
        self.busy_s = self.batch_x_s = self.padded_x_s = self.waste_x_s = 0.0

    def step(self, start_s: float, d: float, batch: int, decodes: int, tokens: int,
             emitted: int, padded: int, waiting: int, running: int, used: int, held: int,
             live: int) -> None:
        if decodes:
            self.itl.add(d, decodes)
            self.slices.add(start_s, d, decodes)
        if held > live:
            self.waste_x_s += (held - live) * d
        self.series.add(start_s, d, batch, waiting, running, used, tokens, emitted, held, live)
        self.busy_s += d
        self.batch_x_s += batch * d
        self.padded_x_s += padded * d


def _plan(decode_contexts: list[int], chunks: list[tuple[int, int]], padded: int) -> StepPlan:
    """Decodes (context each) then prefill chunks (tokens, context); every decode emits."""
    entries = [(1, c, False) for c in decode_contexts] + [(t, c, True) for t, c in chunks]
    shape = StepShape(prefill_chunk_tokens=tuple(t for t, _ in chunks),
                      prefill_context_tokens=tuple(c for _, c in chunks),
                      num_decodes=len(decode_contexts),
                      decode_context_sum=sum(decode_contexts),
                      decode_context_max=max(decode_contexts, default=0), padded_batch=padded)
    return checked_plan(StepPlan(
        request_ids=tuple(range(len(entries))), num_new_tokens=tuple(e[0] for e in entries),
        context_tokens=tuple(e[1] for e in entries), block_tables=tuple(() for _ in entries),
        is_prefill=tuple(e[2] for e in entries),
        emits_token=tuple(not e[2] or i % 2 == 0 for i, e in enumerate(entries)), shape=shape))


durations = st.one_of(st.floats(1e-7, 3.0), st.sampled_from([0.0, 1e-6, 0.01, 0.25]),
                      st.integers(-9000, 2000).map(lambda k: math.exp(k / _SCALE)))
step_st = st.tuples(st.just("step"), durations, st.lists(st.integers(0, 900), max_size=5),
                    st.lists(st.tuples(st.integers(1, 64), st.integers(0, 500)), max_size=2),
                    st.integers(0, 9), st.integers(0, 40), st.integers(0, 30),
                    st.one_of(st.none(), st.integers(0, 4000)))
run_st = st.tuples(st.just("run"), st.lists(durations, min_size=1, max_size=40),
                   st.integers(1, 12), st.integers(0, 3), st.integers(0, 3000),
                   st.sampled_from([1, 16]), st.integers(0, 9), st.integers(0, 50))
event_st = st.tuples(st.one_of(step_st, run_st), st.booleans(), st.floats(0.0, 1.0))


@settings(max_examples=150, deadline=None)
@given(events=st.lists(event_st, min_size=1, max_size=25), capacity=st.integers(1, 24))
def test_bulk_recording_equals_a_loop_over_steps(events: list, capacity: int) -> None:
    rec = RunRecorder(max_buckets=4, bucket_width_s=0.01, rows=None)
    rec._steps = StepBuffer(capacity)  # small blocks: folds inside runs and between steps
    rec._itl_slices = ITLSlices(max_slices=4, width_s=0.05)
    loop = LoopRecorder()
    clock_s = 0.0
    for (kind, *args), in_order, back in events:
        # a fleet's recorder sees replicas' steps out of time order
        start_s = clock_s if in_order else clock_s * back
        if kind == "step":
            d, contexts, chunks, extra_pad, waiting, used, held = args
            p = _plan(contexts, chunks, len(contexts) + len(chunks) + extra_pad)
            rec.record_step(start_s, d, p, waiting, 3, used, held)
            batch, n = len(p.request_ids), len(contexts)
            live = sum(contexts) + n + sum(c + t for t, c in chunks)
            loop.step(start_s, d, batch, n, n + sum(t for t, _ in chunks),
                      p.emits_token.count(True), max(p.shape.padded_batch, batch), waiting,
                      3, used, -1 if held is None else held, -1 if held is None else live)
            clock_s = start_s + d
            continue
        ds, n, extra_pad, context, block_size, waiting, used0 = args
        steps = len(ds)
        dur = np.array(ds)
        start = start_s + np.concatenate(([0.0], np.cumsum(dur)[:-1]))
        used = used0 + np.arange(steps, dtype=np.int64) // 3
        queue = waiting + np.arange(steps, dtype=np.int64) // 5
        shape = StepShape(num_decodes=n, decode_context_sum=context, decode_context_max=context,
                          padded_batch=n + extra_pad)
        run = DecodeRun(steps + 2, shape, np.concatenate((used, used[-1:] + [1, 2])), waiting,
                        False, block_size, False)
        rec.record_decode_run(run, start, dur, queue)
        for s in range(steps):
            loop.step(float(start[s]), ds[s], n, n, n, n, n + extra_pad, int(queue[s]), n,
                      int(used[s]), int(used[s]) * block_size, context + n * (s + 1))
        clock_s = float(start[-1] + dur[-1])
    slices = rec.itl_slices  # folds what is buffered
    assert slices.width_s == loop.slices.width_s
    assert slices._bins == loop.slices._bins and slices._count == loop.slices._count
    assert slices._sum == loop.slices._sum
    h, g = rec._itl, loop.itl
    assert (h.count, h._mean, h._m2, h.min_s, h.max_s) == (g.count, g._mean, g._m2, g.min_s,
                                                          g.max_s)
    np.testing.assert_array_equal(h._counts, g._counts)
    assert rec._series.width_s == loop.series.width_s
    for name in ("busy_s", "batch_x_s", "waiting_x_s", "running_x_s", "kv_x_s", "kv_busy_s",
                 "held_x_s", "live_x_s", "steps", "tokens", "tokens_emitted", "max_batch_size",
                 "max_waiting", "max_running", "max_kv_blocks_used"):
        assert getattr(rec._series, name).tolist() == getattr(loop.series, name).tolist(), name
    assert (rec._busy_s, rec._batch_x_s, rec._padded_x_s, rec._waste_x_s) == (
        loop.busy_s, loop.batch_x_s, loop.padded_x_s, loop.waste_x_s)


@settings(max_examples=200, deadline=None)
@given(ks=st.lists(st.integers(-20000, 20000), min_size=1, max_size=30),
       nudge=st.lists(st.integers(-1, 1), min_size=30, max_size=30),
       others=st.lists(st.floats(1e-300, 1e300), max_size=30),
       offset=st.sampled_from([0.0, -1.5, 12.25, math.log(1e-6) * _SCALE - 1.0]))
def test_floor_log_bins_as_math_log(ks: list[int], nudge: list[int], others: list[float],
                                    offset: float) -> None:
    """Values on and next to bin edges (where np.log's last bit could matter) and anywhere."""
    edges = [math.exp((k + offset) / _SCALE) for k in ks]
    near = [v if n == 0 else float(np.nextafter(v, math.inf if n > 0 else 0.0))
            for v, n in zip(edges, nudge, strict=False)]  # one ulp either side
    values = [*near, *edges, *others]
    got = floor_log(np.array(values), _SCALE, offset)
    assert got.tolist() == [math.floor(math.log(v) * _SCALE - offset) for v in values]


def test_floor_log_falls_back_near_edges() -> None:
    """A product within EDGE of an integer is recomputed (an exact edge is on the grid)."""
    v = np.array([math.exp(7 / _SCALE), 0.5])
    t = np.log(v) * _SCALE
    assert abs(t[0] - round(t[0])) < EDGE
    assert floor_log(v, _SCALE).tolist() == [math.floor(math.log(x) * _SCALE) for x in v]


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=12),
       columns=st.integers(1, 3), data=st.data())
def test_add_in_order_adds_left_to_right(lengths: list[int], columns: int, data) -> None:
    total = sum(lengths)
    terms = np.array(data.draw(st.lists(st.floats(-1e6, 1e6), min_size=total * columns,
                                        max_size=total * columns))).reshape(total, columns)
    init = np.array(data.draw(st.lists(st.floats(-1e3, 1e3), min_size=len(lengths) * columns,
                                       max_size=len(lengths) * columns))).reshape(-1, columns)
    starts = np.cumsum([0, *lengths[:-1]])
    expected = []
    for g, (a, n) in enumerate(zip(starts.tolist(), lengths, strict=True)):
        row = init[g].tolist()
        for r in range(a, a + n):
            row = [x + t for x, t in zip(row, terms[r].tolist(), strict=True)]
        expected.append(row)
    assert add_in_order(init, terms, starts).tolist() == expected


def _left_to_right(block: np.ndarray) -> list:
    """Python's float additions, row after row: the order sum_rows must keep."""
    flat = block.reshape(len(block), -1).tolist()
    acc = flat[0]
    for row in flat[1:]:
        acc = [a + x for a, x in zip(acc, row, strict=True)]
    return acc


def test_sum_rows_adds_left_to_right_on_many_shapes() -> None:
    """numpy's reduce order is not promised: this catches a numpy that sums a wide block's
    columns pairwise (the data tells the orders apart: a 1-D pairwise sum differs)."""
    rng = np.random.default_rng(15)
    told_apart = False
    for shape in [(1, 5), (2, 1), (2, 2), (3, 2), (7, 3), (8, 2), (9, 4), (16, 8), (17, 5),
                  (40, 241, 8), (75, 122, 8), (129, 3), (300, 2), (1000, 4), (8193, 2),
                  (9, 2, 1), (33, 1, 8), (20, 100, 1), (5, 990, 8)]:
        block = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 9, shape)
        block[rng.random(shape) < 0.1] = -0.0  # padding, as add_in_order lays out
        got = sum_rows(block).reshape(-1).tolist()
        assert got == _left_to_right(block), shape
        column = np.ascontiguousarray(block.reshape(len(block), -1)[:, 0])
        told_apart |= float(np.add.reduce(column)) != _left_to_right(column[:, None])[0]
    assert told_apart
    tall = rng.standard_normal((500, 1)) * 10.0 ** rng.integers(-8, 9, (500, 1))
    assert sum_rows(tall).tolist() == _left_to_right(tall)  # one a row: accumulated
