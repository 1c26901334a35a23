"""The SimPy world driven with real schedulers, KV pools and recorders."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.catalogue import get_hardware, get_model
from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler, StaticScheduler
from sim.latency.roofline import RooflineLatency
from sim.results.record.recorder import RunRecorder
from sim.world.fleet import simulate


class FixedLatency:
    """Every step takes `step_s`; counts steps and stops a run that never ends."""

    name = "fixed"

    def __init__(self, step_s: float, max_steps: int = 100_000) -> None:
        self.step_s = step_s
        self.max_steps = max_steps
        self.shapes: list[StepShape] = []

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        self.shapes.append(shape)
        if len(self.shapes) > self.max_steps:
            raise RuntimeError("simulation did not end: livelock")
        return self.step_s + moved_s

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        return np.full(steps, self.step_s)


class SpyRecorder(RunRecorder):
    """A real recorder that also keeps each step's start time and plan, for assertions."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[float, float, StepPlan]] = []

    def record_step(self, start_s: float, duration_s: float, plan: StepPlan, num_waiting: int,
                    num_running: int, kv_blocks_used: int,
                    kv_slots_held: int | None = None) -> None:
        self.steps.append((start_s, duration_s, plan))
        super().record_step(start_s, duration_s, plan, num_waiting, num_running, kv_blocks_used,
                            kv_slots_held)

    @property
    def starts(self) -> list[float]:
        return [start for start, _, _ in self.steps]

    @property
    def tokens_emitted(self) -> int:
        return sum(plan.emits_token.count(True) for _, _, plan in self.steps)


def scheduler(num_blocks: int = 1000, block_size: int = 16, max_num_seqs: int = 32,
              max_num_batched_tokens: int = 2048, chunked_prefill: bool = True,
              max_model_len: int | None = None) -> ContinuousScheduler:
    kv = PagedBlockManager(num_blocks, block_size, watermark=0.0)
    return ContinuousScheduler(kv, max_num_seqs, max_num_batched_tokens, chunked_prefill,
                               max_model_len)


def run(requests: list[Request], sched: ContinuousScheduler,
        latency: FixedLatency | RooflineLatency) -> tuple[SpyRecorder, float, int]:
    """Simulate from a lazy iterator (as run_scenario does); returns recorder, end, on_done sum."""
    recorder = SpyRecorder()
    done: list[int] = []

    def lazy() -> Iterator[Request]:
        yield from requests

    # the spy keeps every step's plan: one event per step
    end_s = simulate(lazy(), sched, latency, recorder, on_done=done.append, fast_forward=False)
    return recorder, end_s, sum(done)


def test_every_request_recorded_once_and_every_token_generated() -> None:
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(0.05, 300))
    requests = [Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        arrivals, rng.integers(1, 3000, 300), rng.integers(1, 400, 300), strict=True))]
    sched = scheduler(num_blocks=3000, max_model_len=3200)
    latency = RooflineLatency(get_model("llama-3-8b"), get_hardware("h100-sxm"))
    recorder, end_s, reported = run(requests, sched, latency)

    summary = recorder.summary()
    frame = recorder.requests_frame()
    assert summary["rejected"] > 0  # some prompt+output exceed max_model_len 3200
    assert summary["completed"] + summary["rejected"] == len(requests) == reported
    assert sorted(frame["request_id"]) == list(range(len(requests)))
    finished = [r for r in requests if r.state is RequestState.FINISHED]
    assert len(finished) == summary["completed"]
    assert all(r.state is RequestState.REJECTED for r in requests if r not in finished)
    assert summary["total_output_tokens"] == sum(r.output_tokens for r in finished)
    assert recorder.tokens_emitted == summary["total_output_tokens"]
    assert all(r.num_output_done == r.output_tokens for r in finished)
    assert end_s == max(r.finish_s for r in finished)
    assert sched.kv.num_used_blocks == 0 and not sched.has_unfinished()


def test_arrival_during_a_step_waits_for_the_next_step() -> None:
    a = Request(0, 0.0, prompt_tokens=10, output_tokens=3)
    b = Request(1, 0.5, prompt_tokens=10, output_tokens=3)
    latency = FixedLatency(1.0)
    recorder, end_s, _ = run([a, b], scheduler(), latency)

    assert a.first_scheduled_s == 0.0
    assert b.first_scheduled_s == 1.0
    assert recorder.starts[:2] == [0.0, 1.0]
    first, second = recorder.steps[0][2], recorder.steps[1][2]
    assert first.request_ids == (0,)  # B arrived mid-step: not in that plan ...
    assert second.request_ids == (0, 1)  # ... but in the next one
    assert latency.shapes[0].num_prefill_tokens == 10
    assert b.first_token_s == 2.0 and b.finish_s == 4.0 and end_s == 4.0


def test_arrival_exactly_at_a_step_end_joins_the_next_plan() -> None:
    """Arrivals are visible at the next schedule(): one at the step's end time is in it.

    C's arrival timer is created at t=0.5, after the step's timer (t=0), so a SimPy
    world that schedules before same-time arrivals fire would leave C out until t=2
    (while without B, C joins at t=1: the outcome must not depend on timer order).
    """
    a = Request(0, 0.0, 10, 5)
    b = Request(1, 0.5, 10, 5)
    c = Request(2, 1.0, 10, 5)
    run([a, b, c], scheduler(), FixedLatency(1.0))
    assert b.first_scheduled_s == 1.0
    assert c.first_scheduled_s == 1.0


def test_sleeps_between_sparse_arrivals_without_inflating_ttft() -> None:
    a = Request(0, 0.0, prompt_tokens=100, output_tokens=4)
    b = Request(1, 100.0, prompt_tokens=100, output_tokens=4)
    latency = FixedLatency(0.25)
    recorder, end_s, _ = run([a, b], scheduler(), latency)

    assert a.finish_s == 1.0
    assert b.first_scheduled_s == 100.0
    assert b.first_token_s - b.arrival_s == 0.25  # one prefill step, no leftover wait
    assert end_s == 101.0
    assert len(latency.shapes) == 8  # no idle steps while asleep
    assert recorder.starts[4:] == [100.0, 100.25, 100.5, 100.75]
    assert recorder.summary()["num_steps"] == 8


def test_sparse_arrival_ttft_is_one_roofline_prefill_step() -> None:
    latency = RooflineLatency(get_model("llama-3-8b"), get_hardware("h100-sxm"))
    a, b = Request(0, 0.0, 512, 8), Request(1, 100.0, 512, 8)
    recorder, _, _ = run([a, b], scheduler(), latency)
    prefill = StepShape((512,), (0,), padded_batch=1)
    assert b.first_token_s - b.arrival_s == pytest.approx(latency.step_time(prefill), rel=1e-12)
    assert recorder.summary()["median_ttft_ms"] == pytest.approx(latency.step_time(prefill) * 1e3)


def test_requests_that_cannot_fit_are_rejected_with_reasons() -> None:
    # pool: 9 usable blocks x 4 tokens = 36 KV tokens; max_model_len 40
    requests = [
        Request(0, 0.0, 10, 5),    # fits
        Request(1, 0.1, 30, 20),   # 50 > max_model_len 40
        Request(2, 0.2, 30, 8),    # 37 KV tokens > 36 in the pool
        Request(3, 0.3, 20, 10),   # fits
    ]
    recorder, _, reported = run(requests, scheduler(num_blocks=10, block_size=4,
                                                   max_model_len=40), FixedLatency(0.01))
    summary = recorder.summary()
    assert reported == 4
    assert summary["completed"] == 2 and summary["rejected"] == 2
    reasons = summary["rejection_reasons"]
    assert sorted(reasons.values()) == [1, 1]
    assert any("max_model_len 40" in reason for reason in reasons)
    assert any("pool holds 36" in reason for reason in reasons)
    frame = recorder.requests_frame().set_index("request_id")
    assert list(frame.loc[[1, 2], "status"]) == ["rejected", "rejected"]
    assert frame.loc[[0, 3], "rejection_reason"].isna().all()
    assert summary["total_output_tokens"] == 5 + 10


workloads = st.lists(st.tuples(st.floats(0, 3, allow_nan=False), st.integers(1, 60),
                               st.integers(1, 40)), min_size=1, max_size=25)


@settings(max_examples=30, deadline=None)
@given(workloads, st.integers(6, 24), st.sampled_from([1, 4, 8]), st.integers(1, 8),
       st.booleans())
def test_memory_pressure_terminates_and_everything_that_fits_finishes(
        spec: list[tuple[float, int, int]], num_blocks: int, block_size: int, max_seqs: int,
        chunked: bool) -> None:
    spec = sorted(spec)
    requests = [Request(i, t, p, o) for i, (t, p, o) in enumerate(spec)]
    sched = scheduler(num_blocks, block_size, max_seqs, max(64, max_seqs), chunked)
    recorder, _, reported = run(requests, sched, FixedLatency(0.01))

    pool_tokens = (num_blocks - 1) * block_size
    fits = [r for r in requests if r.max_kv_tokens <= pool_tokens]
    summary = recorder.summary()
    assert reported == len(requests) == summary["completed"] + summary["rejected"]
    assert all(r.state is RequestState.FINISHED for r in fits)
    assert summary["completed"] == len(fits)
    assert summary["total_output_tokens"] == sum(r.output_tokens for r in fits)
    assert recorder.tokens_emitted == summary["total_output_tokens"]
    assert sched.kv.num_used_blocks == 0 and not sched.has_unfinished()
    assert summary["max_kv_blocks_used"] is None or summary["max_kv_blocks_used"] <= num_blocks - 1


def test_tiny_pool_forces_preemption_and_still_finishes() -> None:
    """A concrete run where recompute preemption must happen (hypothesis may miss it)."""
    requests = [Request(i, 0.0, 8, 24) for i in range(4)]  # each grows to 31 KV tokens
    sched = scheduler(num_blocks=13, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    recorder, _, _ = run(requests, sched, FixedLatency(0.01))
    summary = recorder.summary()
    assert summary["completed"] == 4
    assert summary["total_preemptions"] > 0
    assert summary["total_output_tokens"] == 4 * 24


class ClosingSpy(ContinuousScheduler):
    """A real continuous scheduler that logs when it is closed and what it held then."""

    def __init__(self) -> None:
        super().__init__(PagedBlockManager(1000, 16, watermark=0.0), 32, 2048)
        self.closes: list[tuple[float, int]] = []

    def close(self, now: float) -> None:
        self.closes.append((now, self.num_waiting + self.num_running))
        super().close(now)


def test_scheduler_is_closed_once_right_after_the_last_arrival() -> None:
    requests = [Request(0, 0.0, 10, 50), Request(1, 0.2, 10, 50), Request(2, 0.3, 10, 2)]
    sched = ClosingSpy()
    run(requests, sched, FixedLatency(0.1))
    assert sched.closes == [(0.3, 3)]  # the last request was already queued
    assert all(r.state is RequestState.FINISHED for r in requests)


def test_end_of_arrivals_wakes_an_idle_static_replica_for_its_short_batch() -> None:
    """Static batching waits for B = 8; the last arrival closes it, so the short batch runs."""
    sched = StaticScheduler(ContiguousAllocator(100, 4, watermark=0.0), batch_size=8,
                            max_model_len=64)
    requests = [Request(0, 0.0, 10, 2), Request(1, 3.0, 10, 2)]
    recorder, end_s, reported = run(requests, sched, FixedLatency(0.5))
    assert requests[0].first_scheduled_s == requests[1].first_scheduled_s == 3.0
    assert end_s == 4.0 and reported == 2
    assert recorder.starts == [3.0, 3.5]
