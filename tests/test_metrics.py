"""RunRecorder metrics against hand-computed cases, its bounded step aggregates
(log histogram, adaptive time buckets), and the outputs it writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.plan import StepPlan, StepShape, checked_plan
from sim.core.request import Request, RequestState
from sim.plots.run import plot_run, plot_timeseries
from sim.results.files.report import format_summary, jsonable
from sim.results.files.write import write_run_files
from sim.results.record.recorder import RunRecorder
from sim.results.record.time_buckets import TimeBuckets
from sim.results.stats.percentiles import LogHistogram, describe_ms, weighted_percentiles
from sim.results.stats.slo import SLO


def write_outputs(rec: RunRecorder, out_dir: Path, summary: dict, plots: bool = True
                  ) -> list[Path]:
    """A recorder's files and (with `plots`) its pictures, as a run writes them."""
    requests, series = rec.requests_frame(), rec.steps_frame()
    paths = write_run_files(out_dir, summary, requests, series)
    return paths + (plot_run(out_dir, summary, requests, series) if plots else [])


# the documented percentile bound of LogHistogram's default 0.1% bins, plus float slack
HIST_REL = math.sqrt(1.001) - 1 + 1e-9

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def finished(rid: int, arrival_s: float, scheduled_s: float, first_token_s: float,
             finish_s: float, prompt: int = 10, output: int = 3, preemptions: int = 0,
             prefix_hit: int = 0) -> Request:
    req = Request(request_id=rid, arrival_s=arrival_s, prompt_tokens=prompt,
                  output_tokens=output)
    req.state = RequestState.FINISHED
    req.first_scheduled_s, req.first_token_s, req.finish_s = scheduled_s, first_token_s, finish_s
    req.num_output_done, req.num_preemptions = output, preemptions
    req.prefix_hit_tokens = prefix_hit
    return req


def rejected(rid: int, arrival_s: float, reason: str) -> Request:
    req = Request(request_id=rid, arrival_s=arrival_s, prompt_tokens=5000, output_tokens=8)
    req.reject(reason, now=arrival_s)
    return req


def plan(entries: list[tuple[int, int, int, bool, bool]]) -> StepPlan:
    """entries: (request_id, new_tokens, context_tokens, is_prefill, emits_token)."""
    prefills = [e for e in entries if e[3]]
    decodes = [e for e in entries if not e[3]]
    shape = StepShape(prefill_chunk_tokens=tuple(e[1] for e in prefills),
                      prefill_context_tokens=tuple(e[2] for e in prefills),
                      num_decodes=len(decodes),
                      decode_context_sum=sum(e[2] for e in decodes),
                      decode_context_max=max((e[2] for e in decodes), default=0),
                      padded_batch=len(entries))
    return checked_plan(StepPlan(request_ids=tuple(e[0] for e in entries),
                                 num_new_tokens=tuple(e[1] for e in entries),
                                 context_tokens=tuple(e[2] for e in entries),
                                 block_tables=tuple(() for _ in entries),
                                 is_prefill=tuple(e[3] for e in entries),
                                 emits_token=tuple(e[4] for e in entries), shape=shape))


def two_request_run() -> tuple[RunRecorder, dict[int, list[float]]]:
    """A (prompt 10, 3 out) and B (prompt 6, 3 out) on back-to-back steps.

    Returns the recorder and each request's token emission times, from which
    the per-gap ITLs are computed by hand.
    """
    rec = RunRecorder()
    steps = [  # (start_s, duration_s, entries, waiting, running, kv_used)
        (0.00, 0.10, [(0, 10, 0, True, True)], 1, 1, 1),
        (0.10, 0.02, [(0, 1, 10, False, True), (1, 6, 0, True, True)], 0, 2, 2),
        (0.12, 0.03, [(0, 1, 11, False, True), (1, 1, 6, False, True)], 0, 2, 2),
        (0.15, 0.01, [(1, 1, 7, False, True)], 0, 1, 1),
    ]
    for start_s, duration_s, entries, waiting, running, kv in steps:
        rec.record_step(start_s, duration_s, plan(entries), waiting, running, kv)
    rec.record_finished(finished(0, 0.00, 0.00, 0.10, 0.15, prompt=10, output=3))
    rec.record_finished(finished(1, 0.05, 0.10, 0.12, 0.16, prompt=6, output=3))
    return rec, {0: [0.10, 0.12, 0.15], 1: [0.12, 0.15, 0.16]}


def test_latency_formulas_hand_computed() -> None:
    rec, _ = two_request_run()
    s = rec.summary()
    assert s["completed"] == 2 and s["rejected"] == 0
    assert s["duration"] == pytest.approx(0.16)
    assert s["total_input_tokens"] == 16 and s["total_output_tokens"] == 6
    assert s["request_throughput"] == pytest.approx(2 / 0.16)
    assert s["total_token_throughput"] == pytest.approx(22 / 0.16)
    ttft_ms, e2el_ms = [100.0, 70.0], [150.0, 110.0]
    tpot_ms = [(150 - 100) / 2, (110 - 70) / 2]
    for m, v in (("ttft", ttft_ms), ("e2el", e2el_ms), ("tpot", tpot_ms),
                 ("queue", [0.0, 50.0])):
        assert s[f"mean_{m}_ms"] == pytest.approx(np.mean(v))
        assert s[f"median_{m}_ms"] == pytest.approx(np.median(v))
        assert s[f"std_{m}_ms"] == pytest.approx(np.std(v))
        assert s[f"p99_{m}_ms"] == pytest.approx(np.percentile(v, 99))
    # time-weighted batch: (1*.10 + 2*.02 + 2*.03 + 1*.01) / .16
    assert s["mean_batch_size"] == pytest.approx(0.21 / 0.16)
    assert s["max_kv_blocks_used"] == 2 and s["num_steps"] == 4
    frame = rec.requests_frame()
    assert frame["ttft_ms"].tolist() == pytest.approx(ttft_ms)
    assert frame["tpot_ms"].tolist() == pytest.approx(tpot_ms)


def test_pooled_itl_equals_per_gap_itl() -> None:
    rec, token_times = two_request_run()
    gaps_ms = np.concatenate([np.diff(t) for t in token_times.values()]) * 1e3
    s = rec.summary()
    assert s["mean_itl_ms"] == pytest.approx(np.mean(gaps_ms), rel=1e-9)
    assert s["std_itl_ms"] == pytest.approx(np.std(gaps_ms), rel=1e-9)
    for p in (50, 90, 95, 99):
        key = "median_itl_ms" if p == 50 else f"p{p}_itl_ms"
        assert s[key] == pytest.approx(np.percentile(gaps_ms, p), rel=HIST_REL)
    series = rec.steps_frame()  # 10 ms buckets: each step in its own bucket
    assert series["steps"].tolist() == [1, 1, 1, 1]
    assert series["tokens_emitted"].tolist() == [1, 2, 2, 1]
    assert series["tokens"].tolist() == [10, 7, 2, 1]
    assert series["busy_s"].tolist() == pytest.approx([0.10, 0.02, 0.03, 0.01])
    assert series["mean_batch_size"].tolist() == [1, 2, 2, 1]
    assert series["mean_waiting"].tolist() == [1, 0, 0, 0]
    assert series["max_kv_blocks_used"].tolist() == [1, 2, 2, 1]
    assert series["t_start_s"].iloc[0] == 0.0 and series["t_end_s"].iloc[0] == 0.01


def test_tpot_excludes_single_token_outputs() -> None:
    rec = RunRecorder()
    rec.record_finished(finished(0, 0.0, 0.0, 0.2, 0.2, output=1))
    rec.record_finished(finished(1, 0.0, 0.0, 0.1, 0.5, output=5))
    s = rec.summary()
    assert s["mean_tpot_ms"] == pytest.approx(100.0)
    assert s["p99_tpot_ms"] == pytest.approx(100.0)
    assert s["mean_ttft_ms"] == pytest.approx(150.0)
    assert math.isnan(rec.requests_frame()["tpot_ms"][0])


def test_goodput_counts_only_requests_meeting_every_slo() -> None:
    rec = RunRecorder()
    rec.record_finished(finished(0, 0.0, 0.0, 0.10, 0.30, output=5))  # ttft 100, tpot 50
    rec.record_finished(finished(1, 0.0, 0.0, 0.30, 0.40, output=5))  # ttft 300: fails
    rec.record_finished(finished(2, 0.0, 0.0, 0.10, 0.90, output=5))  # tpot 200: fails
    rec.record_finished(finished(3, 0.0, 0.0, 0.15, 0.15, output=1))  # no tpot: passes
    rec.record_rejected(rejected(4, 0.5, "prompt_too_long"))
    s = rec.summary(slo=SLO(ttft_ms=200, tpot_ms=60))
    assert s["duration"] == pytest.approx(0.9)
    assert s["request_goodput"] == pytest.approx(2 / 0.9)
    assert s["slo_attainment"] == pytest.approx(2 / 5)
    assert rec.summary(slo=SLO(e2el_ms=350))["request_goodput"] == pytest.approx(2 / 0.9)
    assert "request_goodput" not in rec.summary(slo=SLO())
    assert "request_goodput" not in rec.summary()


def test_slo_parse() -> None:
    assert SLO.parse("ttft:200 tpot:50") == SLO(ttft_ms=200.0, tpot_ms=50.0)
    assert SLO.parse("e2el:1000,ttft:5") == SLO(ttft_ms=5.0, e2el_ms=1000.0)
    with pytest.raises(ValueError):
        SLO.parse("latency:3")
    with pytest.raises(ValueError):
        SLO(ttft_ms=-1.0)


def test_rejected_counted_and_excluded_from_latency() -> None:
    rec = RunRecorder()
    rec.record_finished(finished(0, 0.0, 0.0, 0.1, 0.2, output=2))
    rec.record_rejected(rejected(1, 0.05, "prompt_too_long"))
    rec.record_rejected(rejected(2, 0.06, "queue_full"))
    rec.record_rejected(rejected(3, 0.07, "prompt_too_long"))
    s = rec.summary()
    assert s["completed"] == 1 and s["rejected"] == 3
    assert s["rejection_reasons"] == {"prompt_too_long": 2, "queue_full": 1}
    assert s["mean_e2el_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(100.0)
    assert s["total_input_tokens"] == 10
    frame = rec.requests_frame()
    assert frame["status"].tolist() == ["finished", "rejected", "rejected", "rejected"]
    assert frame["rejection_reason"].tolist() == [None, "prompt_too_long", "queue_full",
                                                  "prompt_too_long"]
    assert frame.loc[1:, "e2el_ms"].isna().all()


def test_record_finished_refuses_unfinished_request() -> None:
    with pytest.raises(ValueError):
        RunRecorder().record_finished(Request(0, 0.0, 4, 4))


def test_recording_continues_after_summary() -> None:
    rec, _ = two_request_run()
    rec.summary()
    rec.steps_frame()
    rec.record_finished(finished(9, 0.2, 0.2, 0.3, 0.4))  # no BufferError from exports
    assert rec.num_requests == 3


def test_write_outputs_and_plots(tmp_path: Path) -> None:
    rec, _ = two_request_run()
    rec.record_rejected(rejected(7, 0.01, "prompt_too_long"))
    summary = rec.summary(slo=SLO(ttft_ms=90, tpot_ms=30), kv_blocks_total=8)
    paths = write_outputs(rec, tmp_path / "out", summary)
    names = {p.name for p in paths}
    assert {"summary.json", "requests.csv", "timeseries.csv"} <= names
    assert all(p.exists() for p in paths)
    # no step reported kv_slots_held, so the KV waste figures are NaN -> null
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written.pop("provenance")["scenario_schema_version"] >= 1  # what made the run
    assert written == jsonable(summary)
    assert summary["kv_waste_fraction"] != summary["kv_waste_fraction"]
    pngs = [p for p in paths if p.suffix == ".png"]
    assert len(pngs) == 2
    for png in pngs:
        data = png.read_bytes()
        assert len(data) > 0 and data.startswith(PNG_MAGIC)
    lines = (tmp_path / "out" / "requests.csv").read_text().splitlines()
    assert len(lines) == 1 + 3
    series_lines = (tmp_path / "out" / "timeseries.csv").read_text().splitlines()
    assert series_lines[0].startswith("t_start_s,t_end_s,steps,busy_s,mean_batch_size")
    assert len(series_lines) == 1 + 4
    no_plots = write_outputs(rec, tmp_path / "bare", summary, plots=False)
    assert [p.suffix for p in no_plots] == [".json", ".csv", ".csv"]


def test_empty_run_does_not_crash(tmp_path: Path) -> None:
    rec = RunRecorder()
    s = rec.summary(slo=SLO(ttft_ms=100), kv_blocks_total=4)
    assert s["completed"] == 0 and s["rejected"] == 0
    assert math.isnan(s["mean_ttft_ms"]) and math.isnan(s["request_throughput"])
    assert s["max_kv_blocks_used"] is None
    assert "n/a" in format_summary(s)
    paths = write_outputs(rec, tmp_path, s)
    loaded = json.loads((tmp_path / "summary.json").read_text())
    assert loaded["mean_ttft_ms"] is None and loaded["duration"] is None
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths if p.suffix == ".png")


def test_format_summary_block() -> None:
    rec, _ = two_request_run()
    text = format_summary(rec.summary(slo=SLO(ttft_ms=150)))
    assert "Serving Benchmark Result" in text
    for label in ("Successful requests:", "Mean TTFT (ms):", "P99 ITL (ms):",
                  "Median E2EL (ms):", "Request goodput (req/s):"):
        assert label in text
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # every line the same width


def padded(step: StepPlan, padded_batch: int) -> StepPlan:
    """The same step with `padded_batch` kernel slots (static batching pads finished members)."""
    return step._replace(shape=step.shape._replace(padded_batch=padded_batch))


def waste_run() -> RunRecorder:
    """Four steps with hand-countable slots and KV (block size 16, pool 8 blocks = 128 slots).

    A: 0.1 s, prefills of 10 and 6 tokens; 2 slots; held 32 (a block each); live 16.
    B: 0.2 s, decodes at contexts 10 and 6; 4 slots (2 padded); held 64; live 18.
    C: 0.3 s, one decode at context 11; 1 slot; held not reported (left out of KV).
    D: 0.1 s, decodes at contexts 8 and 8 sharing a prefix block: held 16 < live 18,
       so its waste is clamped at 0 while held and live still count.
    """
    rec = RunRecorder()
    rec.record_step(0.0, 0.1, plan([(0, 10, 0, True, True), (1, 6, 0, True, True)]), 0, 2, 2,
                    kv_slots_held=32)
    rec.record_step(0.1, 0.2, padded(plan([(0, 1, 10, False, True), (1, 1, 6, False, True)]), 4),
                    0, 2, 4, kv_slots_held=64)
    rec.record_step(0.3, 0.3, plan([(0, 1, 11, False, True)]), 0, 1, 1)
    rec.record_step(0.6, 0.1, plan([(2, 1, 8, False, True), (3, 1, 8, False, True)]), 0, 2, 1,
                    kv_slots_held=16)
    return rec


def test_waste_metrics_hand_computed() -> None:
    s = waste_run().summary(kv_blocks_total=8, block_size=16)
    # slots: useful 2*.1 + 2*.2 + 1*.3 + 2*.1 = 1.1 of 2*.1 + 4*.2 + 1*.3 + 2*.1 = 1.5
    assert s["slot_utilization_time_weighted"] == pytest.approx(1.1 / 1.5)
    assert (s["slot_steps_useful"], s["slot_steps_total"]) == (7, 9)
    assert s["slot_utilization"] == pytest.approx(7 / 9)
    assert s["kv_pool_tokens"] == 128
    # KV over A, B, D (0.4 s): waste (32-16)*.1 + (64-18)*.2 + 0 = 10.8
    held_x_s, live_x_s = 32 * .1 + 64 * .2 + 16 * .1, 16 * .1 + 18 * .2 + 18 * .1
    assert s["kv_waste_fraction"] == pytest.approx(10.8 / (128 * 0.4))
    assert s["kv_waste_of_held"] == pytest.approx(10.8 / held_x_s)
    assert s["mean_kv_slots_held"] == pytest.approx(held_x_s / 0.4)
    assert s["mean_kv_live_tokens"] == pytest.approx(live_x_s / 0.4)
    no_pool = waste_run().summary()  # without a pool only the share of held is defined
    assert math.isnan(no_pool["kv_waste_fraction"]) and no_pool["kv_pool_tokens"] is None
    assert no_pool["kv_waste_of_held"] == pytest.approx(10.8 / held_x_s)
    text = format_summary(s)
    assert "Slot utilisation:" in text and "KV waste (share of pool):" in text


def test_waste_time_series_per_bucket(tmp_path: Path) -> None:
    rec = waste_run()
    series = rec.steps_frame()  # 10 ms buckets: one step each
    assert series["mean_kv_slots_held"].tolist()[:2] == [32, 64]
    assert math.isnan(series["mean_kv_slots_held"].iloc[2])  # step C reported no held
    assert series["mean_kv_slots_held"].iloc[3] == 16
    assert series["mean_kv_live_tokens"].tolist()[:2] == [16, 18]
    assert series["mean_kv_live_tokens"].iloc[3] == 18
    paths = write_outputs(rec, tmp_path, rec.summary(kv_blocks_total=8, block_size=16))
    assert (tmp_path / "timeseries.png") in paths
    header = (tmp_path / "timeseries.csv").read_text().splitlines()[0]
    assert header.endswith("mean_kv_slots_held,mean_kv_live_tokens")


def test_no_waste_samples_when_held_is_never_reported() -> None:
    rec, _ = two_request_run()
    s = rec.summary(kv_blocks_total=8, block_size=16)
    assert s["slot_utilization"] == 1.0
    for key in ("kv_waste_fraction", "kv_waste_of_held", "mean_kv_slots_held"):
        assert math.isnan(s[key])
    assert rec.steps_frame()["mean_kv_slots_held"].isna().all()


def test_bucketed_timeseries_plots(tmp_path: Path) -> None:
    rec = RunRecorder(max_buckets=64)
    step = plan([(0, 1, 5, False, True)])
    for i in range(5000):
        rec.record_step(i * 0.01, 0.01, step, i % 5, 1, i % 11)
    series = rec.steps_frame()
    assert len(series) <= 64
    assert (series["mean_waiting"] <= series["max_waiting"]).all()
    png = plot_timeseries(series, tmp_path / "ts.png", kv_blocks_total=16)
    assert png.read_bytes().startswith(PNG_MAGIC)


def _footprint(obj: object) -> dict[str, int]:
    """Length of every container held by the recorder and its accumulators."""
    sizes: dict[str, int] = {}
    for owner_name, owner in (("rec", obj), ("itl", obj._itl), ("series", obj._series)):
        for slot in type(owner).__slots__:
            value = getattr(owner, slot)
            if isinstance(value, dict):
                sizes[f"{owner_name}.{slot}"] = len(value)
                sizes.update({f"{owner_name}.{slot}.{k}": len(v) for k, v in value.items()})
            elif hasattr(value, "__len__"):
                sizes[f"{owner_name}.{slot}"] = len(value)
    return sizes


def test_memory_is_bounded_in_steps() -> None:
    """A million steps leave every container the size it had after a thousand."""
    rec = RunRecorder()
    step = plan([(0, 1, 5, False, True), (1, 1, 9, False, True)])
    record = rec.record_step
    for i in range(1000):
        record(i * 0.02, 0.02, step, i % 3, 2, i % 7)
    early = _footprint(rec)
    for i in range(1000, 1_000_000):
        record(i * 0.02, 0.02, step, i % 3, 2, i % 7)
    assert _footprint(rec) == early
    assert len(rec._series.steps) == 2048 and rec._itl.num_bins == early["itl._counts"]
    series = rec.steps_frame()  # folds the steps still buffered
    assert rec.num_steps == 1_000_000 and rec._itl.count == 2_000_000
    assert len(series) <= 2048 and series["steps"].sum() == 1_000_000
    assert rec._series.width_s == pytest.approx(0.01 * 2**10)  # 20,000 s over 2048 buckets
    s = rec.summary()
    assert s["num_steps"] == 1_000_000 and s["max_kv_blocks_used"] == 6
    assert s["mean_itl_ms"] == pytest.approx(20.0, rel=1e-9)


def test_bucket_merging_keeps_totals_and_maxima() -> None:
    """Many doublings (10 ms to ~2.6e5 s wide) against numpy over the raw steps."""
    rng = np.random.default_rng(7)
    n = 20_000
    start = np.sort(rng.uniform(0, 1e6, n)) * rng.uniform(0, 1, n).round()  # bursts at t=0
    start = np.sort(start)
    dur = rng.exponential(0.03, n)
    cols = rng.integers(0, 500, (5, n))  # batch, waiting, running, kv, tokens
    buckets = TimeBuckets(max_buckets=8, width_s=0.01)
    for i in range(n):
        b, w, r, kv, tok = (int(x) for x in cols[:, i])
        buckets.add(float(start[i]), float(dur[i]), b, w, r, kv, tok, b)
    assert buckets.width_s >= 1e6 / 8 and len(buckets.steps) == 8
    f = buckets.frame()
    assert f["steps"].sum() == n and f["tokens"].sum() == cols[4].sum()
    assert f["busy_s"].sum() == pytest.approx(dur.sum(), rel=1e-12)
    for k, name in enumerate(("batch_size", "waiting", "running", "kv_blocks_used")):
        assert f[f"max_{name}"].max() == cols[k].max()
    # per bucket: equal to grouping the raw steps at the final width
    idx = (start * (1.0 / buckets.width_s)).astype(np.int64)
    rows = np.unique(idx)
    np.testing.assert_array_equal(f["t_start_s"], rows * buckets.width_s)
    np.testing.assert_array_equal(f["steps"], np.bincount(idx)[rows])
    busy = np.bincount(idx, dur)[rows]
    np.testing.assert_allclose(f["busy_s"], busy, rtol=1e-12)
    np.testing.assert_allclose(f["mean_kv_blocks_used"],
                               np.bincount(idx, cols[3] * dur)[rows] / busy, rtol=1e-12)
    peak = np.zeros(rows.size, dtype=np.int64)
    np.maximum.at(peak, np.searchsorted(rows, idx), cols[1])
    np.testing.assert_array_equal(f["max_waiting"], peak)


def test_time_buckets_refuse_negative_start() -> None:
    with pytest.raises(ValueError):
        TimeBuckets().add(-1.0, 0.1, 1, 0, 1, 1, 1, 1)


def test_itl_std_is_exact_when_jitter_is_tiny() -> None:
    """std << mean (a steady batch): Welford keeps 1e-9 where E[x^2] - mean^2 cancels."""
    rng = np.random.default_rng(3)
    values = 0.02 + rng.normal(0, 1e-7, 50_000)
    weights = rng.integers(1, 300, values.size)
    hist = LogHistogram()
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        hist.add(v, w)
    expanded = np.repeat(values, weights)
    assert hist.count == expanded.size
    assert hist.mean_s == pytest.approx(np.mean(expanded), rel=1e-12)
    assert hist.std_s == pytest.approx(np.std(expanded), rel=1e-9)
    assert (hist.min_s, hist.max_s) == (values.min(), values.max())


samples_st = st.lists(st.tuples(st.floats(min_value=1e-6, max_value=9e3, allow_nan=False),
                                st.integers(1, 50)), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(samples=samples_st, qs=st.lists(st.floats(0, 100), min_size=1, max_size=5))
def test_histogram_percentiles_within_documented_bound(samples: list[tuple[float, int]],
                                                       qs: list[float]) -> None:
    hist = LogHistogram()
    for value, weight in samples:
        hist.add(value, weight)
    values = np.array([v for v, _ in samples])
    expanded = np.repeat(values, [w for _, w in samples])
    qs = [*qs, 0, 50, 90, 99, 100]
    np.testing.assert_allclose(hist.percentiles(qs), np.percentile(expanded, qs),
                               rtol=HIST_REL, atol=0)
    assert hist.percentiles([0, 100]).tolist() == [values.min(), values.max()]
    assert hist.mean_s == pytest.approx(np.mean(expanded), rel=1e-9)
    assert hist.std_s == pytest.approx(np.std(expanded), rel=1e-9, abs=1e-12 * values.max())


def test_histogram_outside_range_uses_exact_extremes() -> None:
    hist = LogHistogram()
    hist.add(0.0, 3)  # an instant step underflows
    hist.add(2e4, 1)  # past hi_s: overflow bin
    hist.add(0.5, 4)
    pct = hist.percentiles([0, 50, 100])
    assert pct[0] == 0.0 and pct[2] == 2e4
    assert pct[1] == pytest.approx(0.5, rel=HIST_REL)
    assert math.isnan(LogHistogram().percentiles([50])[0])


values_st = st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
                     min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), values=values_st)
def test_weighted_percentiles_match_expanded_samples(data: st.DataObject,
                                                     values: list[float]) -> None:
    """Convention: numpy's default 'linear' method on the expanded samples (vLLM's)."""
    weights = data.draw(st.lists(st.integers(0, 6), min_size=len(values),
                                 max_size=len(values)))
    if sum(weights) == 0:
        weights[0] = 1
    qs = data.draw(st.lists(st.floats(0, 100), min_size=1, max_size=6)) + [50, 90, 95, 99]
    expanded = np.repeat(np.asarray(values), weights)
    got = weighted_percentiles(np.asarray(values), np.asarray(weights), qs)
    np.testing.assert_allclose(got, np.percentile(expanded, qs), rtol=1e-12, atol=1e-9)
    stats = describe_ms(np.asarray(values) / 1e3, np.asarray(weights))
    assert stats["mean"] == pytest.approx(np.mean(expanded), rel=1e-9, abs=1e-6)
    assert stats["std"] == pytest.approx(np.std(expanded), rel=1e-9, abs=1e-6)
    assert stats["p99"] == pytest.approx(np.percentile(expanded, 99), rel=1e-12, abs=1e-9)
