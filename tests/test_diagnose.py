"""TTFT diagnosis: the parts sum to the TTFT, agree with the traced timelines, name the cause."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.config.catalogue import get_hardware, get_model
from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import PagedBlockManager
from sim.core.request import Request
from sim.core.schedulers import ContinuousScheduler, DynamicScheduler, StaticScheduler
from sim.latency.roofline import RooflineLatency
from sim.observe.diagnose import TTFT_PARTS
from sim.observe.explain import DiagnosisError, dominant_cause, explain_request, explain_run
from sim.observe.observer import ReplicaObserver
from sim.results.record.recorder import RunRecorder
from sim.world.fleet import simulate

ROOF = RooflineLatency(get_model("llama-3-8b"), get_hardware("h100-sxm"))
QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
WAITS = ("ttft_queue_ms", "ttft_batch_fill_ms", "ttft_kv_wait_ms")


def run_observed(requests: Sequence[Request], sched: object, traced: frozenset[int] = frozenset()
                 ) -> tuple[pd.DataFrame, ReplicaObserver]:
    """Simulate with a ReplicaObserver; the requests frame carries the TTFT parts."""
    recorder = RunRecorder()
    observer = ReplicaObserver(sched, ROOF.step_time, traced)
    simulate(iter(requests), sched, ROOF, recorder, observer=observer)  # type: ignore[arg-type]
    recorder.add_columns(observer.diagnoser.frame())
    return recorder.requests_frame(), observer


@st.composite
def small_runs(draw: st.DrawFn) -> tuple[list[Request], object]:
    """A few requests (maybe sharing prefixes) and a scheduler, often with a tight KV pool."""
    policy = draw(st.sampled_from(["continuous", "continuous", "static", "dynamic"]))
    block = draw(st.sampled_from([4, 8, 16]))
    cache = policy == "continuous" and draw(st.booleans())
    n = draw(st.integers(1, 18))
    t, requests = 0.0, []
    for i in range(n):
        t += draw(st.floats(0.0, 0.05))
        prompt = draw(st.integers(1, 160))
        ids = tuple(draw(st.integers(0, 2)) for _ in range(-(-prompt // block))) if cache else None
        requests.append(Request(i, t, prompt, draw(st.integers(1, 30)), prefix_block_ids=ids,
                                prefix_unit_tokens=block))
    fit = -(-200 // block) + 1  # any one request fits; a few more blocks force preemption
    blocks = draw(st.integers(fit, 3 * fit) | st.integers(3 * fit, 10 * fit))
    if policy == "continuous":
        swap = draw(st.booleans())
        kv = PagedBlockManager(blocks, block, 0.0, enable_prefix_cache=cache,
                               host_swap_blocks=10_000 if swap else 0)
        seqs = draw(st.integers(1, 12))
        sched: object = ContinuousScheduler(
            kv, seqs, max(seqs, draw(st.integers(16, 400))), draw(st.booleans()),
            preemption="swap" if swap else "recompute")
    else:
        cls = StaticScheduler if policy == "static" else DynamicScheduler
        kv = ContiguousAllocator(blocks, block, 0.0)
        sched = cls(kv, draw(st.integers(1, 6)), max_wait_s=0.02, max_model_len=200)
    return requests, sched


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_runs())
def test_parts_sum_to_the_ttft_and_match_the_traced_timelines(run: tuple) -> None:
    requests, sched = run
    frame, observer = run_observed(requests, sched, frozenset(r.request_id for r in requests))
    done = frame[frame["status"] == "finished"]
    assert not done[list(TTFT_PARTS)].isna().any().any()  # every finished request diagnosed
    parts = done[list(TTFT_PARTS)]
    assert (parts.to_numpy() >= -1e-9).all()
    assert parts.sum(axis=1).to_numpy() == pytest.approx(done["ttft_ms"].to_numpy(), abs=1e-6)
    # the waits before the first admission are exactly the recorder's queue time
    assert done[list(WAITS)].sum(axis=1).to_numpy() == pytest.approx(
        done["queue_ms"].to_numpy(), abs=1e-6)
    never = done[done["preemptions"] == 0]
    assert (never["ttft_preempt_ms"].abs() < 1e-9).all()
    assert ((done["prefix_hit_tokens"] > 0) == (done["prefix_saved_ms"] > 0)).all()
    # the clocks (O(1) per request) and the step-by-step timelines classify alike
    timeline = observer.tracer.frame()
    first_s = timeline[timeline["kind"] == "first_token"].set_index("request_id")["start_s"]
    timeline = timeline.join(first_s.rename("first_s"), on="request_id")
    before = timeline[timeline["end_s"] <= timeline["first_s"]]
    span_ms = ((before["end_s"] - before["start_s"]) * 1e3).groupby(
        [before["request_id"], before["kind"]]).sum().unstack(fill_value=0.0)
    span_ms = span_ms.reindex(index=done["request_id"], fill_value=0.0)
    for kind in ("batch_fill", "kv_wait", "preempted"):
        if kind not in span_ms:
            span_ms[kind] = 0.0
    by_id = done.set_index("request_id")
    for kind in ("batch_fill", "kv_wait"):
        assert span_ms[kind].to_numpy() == pytest.approx(
            by_id[f"ttft_{kind}_ms"].to_numpy(), abs=1e-6)
    assert (by_id["ttft_preempt_ms"] >= span_ms["preempted"] - 1e-6).all()
    assert (by_id.loc[span_ms["preempted"] > 0, "preemptions"] > 0).all()
    event(f"preempted before first token: {bool((span_ms['preempted'] > 0).any())}")
    event(f"prefix hits: {bool((done['prefix_hit_tokens'] > 0).any())}")
    event(f"kv wait: {bool((done['ttft_kv_wait_ms'] > 0).any())}")
    event(f"swap: {getattr(sched, 'preemption', '') == 'swap' and (done['preemptions'] > 0).any()}")


def test_a_long_prompt_behind_many_is_told_it_queued() -> None:
    """Four seats, thirty requests ahead: the long prompt's TTFT is mostly the queue."""
    requests = [Request(i, 0.0, 100, 60) for i in range(30)] + [Request(30, 1e-3, 4000, 5)]
    sched = ContinuousScheduler(PagedBlockManager(5000, 16, 0.0), 4, 8192)
    frame, _ = run_observed(requests, sched)
    row = frame[frame["request_id"] == 30].iloc[0]
    assert dominant_cause(row) == "ttft_queue_ms"
    assert row["queue_ahead"] == 30 - 4  # the first step, at t=0, seated four
    assert row["ttft_prefill_ms"] > row["ttft_shared_ms"]  # it prefills alone, once admitted
    text = explain_request(row, "continuous")
    assert "request 30 waited" in text and "in the queue behind 26 requests" in text


def test_a_tiny_kv_pool_is_told_it_waited_for_blocks() -> None:
    """Room for two requests' KV: the later ones wait on blocks, not on seats or budget."""
    requests = [Request(i, 0.0, 200, 100) for i in range(12)]
    sched = ContinuousScheduler(PagedBlockManager(45, 16, 0.0), 64, 2048)
    frame, _ = run_observed(requests, sched)
    last = frame[frame["request_id"] == 11].iloc[0]
    assert dominant_cause(last) == "ttft_kv_wait_ms"
    assert "for free KV-cache blocks" in explain_request(last, "continuous")
    # the same requests with a roomy pool never wait on KV
    roomy, _ = run_observed([Request(i, 0.0, 200, 100) for i in range(12)],
                            ContinuousScheduler(PagedBlockManager(4000, 16, 0.0), 64, 2048))
    assert (roomy["ttft_kv_wait_ms"] == 0).all()


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_prefill_preempted_by_a_growing_decode_is_told_so(preemption: str) -> None:
    """31 blocks of 8: request 0's decodes outgrow the pool while request 1 is mid-prefill."""
    kv = PagedBlockManager(31, 8, 0.0, host_swap_blocks=100 if preemption == "swap" else 0)
    sched = ContinuousScheduler(kv, 8, 32, preemption=preemption)
    frame, observer = run_observed([Request(0, 0.0, 40, 100), Request(1, 1e-3, 200, 5)], sched,
                                   frozenset([1]))
    row = frame[frame["request_id"] == 1].iloc[0]
    assert row["preemptions"] >= 1
    assert dominant_cause(row) == "ttft_preempt_ms"
    assert "to preemption" in explain_request(row, "continuous")
    kinds = observer.tracer.frame()["kind"]
    # recompute re-prefills what it dropped; swap brings it back and never recomputes
    assert ("recompute" in set(kinds)) == (preemption == "recompute")


def test_static_batching_names_the_batch_fill_wait() -> None:
    """Arrivals every 0.5 s into batches of 4: the first request waits for three more."""
    requests = [Request(i, 0.5 * i, 100, 20) for i in range(8)]
    sched = StaticScheduler(ContiguousAllocator(2000, 16, 0.0), 4, max_model_len=2048)
    frame, _ = run_observed(requests, sched)
    first = frame[frame["request_id"] == 0].iloc[0]
    assert dominant_cause(first) == "ttft_batch_fill_ms"
    assert first["ttft_batch_fill_ms"] == pytest.approx(1500.0, rel=1e-9)  # arrivals 0 -> 1.5 s
    assert "for its batch to fill: static batching" in explain_request(first, "static")
    # a batch-mate's prefill shares the step: own share = its tokens / the padded batch's
    assert first["ttft_shared_ms"] == pytest.approx(3 * first["ttft_prefill_ms"], rel=1e-9)


def test_static_batch_cut_short_by_the_pool_is_a_kv_wait() -> None:
    """Reservations of 256 tokens in a 40 x 16-token pool: batches of 4 launch with 2."""
    requests = [Request(i, 0.0, 100, 20) for i in range(8)]
    pool = ContiguousAllocator(40, 16, 0.0)
    frame, _ = run_observed(requests, StaticScheduler(pool, 4, max_model_len=256))
    assert frame.loc[frame["request_id"] < 2, "ttft_kv_wait_ms"].eq(0).all()  # the first batch
    later = frame[frame["request_id"] >= 2]
    assert (later.apply(dominant_cause, axis=1) == "ttft_kv_wait_ms").all()
    # a pool with room for four: the same waits are queueing behind the running batch
    roomy, _ = run_observed([Request(i, 0.0, 100, 20) for i in range(8)],
                            StaticScheduler(ContiguousAllocator(400, 16, 0.0), 4,
                                            max_model_len=256))
    assert (roomy["ttft_kv_wait_ms"] == 0).all()
    assert dominant_cause(roomy[roomy["request_id"] == 7].iloc[0]) == "ttft_queue_ms"


def test_explain_run_errors_name_the_problem() -> None:
    frame, _ = run_observed([Request(i, 0.01 * i, 50, 5) for i in range(5)],
                            ContinuousScheduler(PagedBlockManager(500, 16, 0.0), 8, 256))
    text = explain_run(frame, "continuous", slowest=2)
    assert text.count("TTFT") >= 3 and "5 finished requests" in text
    with pytest.raises(DiagnosisError, match="no request 99"):
        explain_run(frame, request_id=99)
    with pytest.raises(DiagnosisError, match="--slowest: must be >= 1, got 0"):
        explain_run(frame, slowest=0)
    with pytest.raises(DiagnosisError, match="re-run"):
        explain_run(frame.drop(columns=["ttft_queue_ms"]))


def test_explain_cli_on_a_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", str(QUICKSTART), "--quiet", "--no-plots", "--out", str(out),
                 "--set", "workload.num_requests=80"]) == 0
    requests = pd.read_csv(out / "requests.csv")
    assert requests[list(TTFT_PARTS)].sum(axis=1).to_numpy() == pytest.approx(
        requests["ttft_ms"].to_numpy(), abs=1e-6)
    capsys.readouterr()
    assert main(["explain", str(out), "--slowest", "2"]) == 0
    text = capsys.readouterr().out
    worst = int(requests.loc[requests["ttft_ms"].idxmax(), "request_id"])
    assert f"request {worst}: TTFT" in text
    assert main(["explain", str(out), "--request", "3"]) == 0
    assert capsys.readouterr().out.startswith("request 3: TTFT")
    for argv, message in ((["explain", str(out), "--request", "5000"], "no request 5000"),
                          (["explain", str(tmp_path / "nope")], "no requests.csv"),
                          (["explain", str(out), "--slowest", "0"], "--slowest: must be >= 1")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
