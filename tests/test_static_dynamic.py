"""Request-level batching (static and dynamic) by hand, through SimPy, and on random workloads."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_des import FixedLatency, SpyRecorder

from sim.assemble import build_block_manager, kv_budget
from sim.config.catalogue import get_hardware, get_model
from sim.config.loader import load_scenario
from sim.config.yaml_input import ScenarioError
from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers import DynamicScheduler, StaticScheduler
from sim.experiments.run import run_scenario
from sim.latency.roofline import RooflineLatency
from sim.world.fleet import simulate


def pool(num_blocks: int = 1000, block_size: int = 4) -> ContiguousAllocator:
    return ContiguousAllocator(num_blocks, block_size, watermark=0.0)


def padded_slot_steps(plans: list[StepPlan]) -> int:
    """Slots the kernels ran over that no live sequence used, summed over steps."""
    return sum(p.shape.padded_batch - p.batch_size for p in plans)


def sim_run(requests: list[Request], sched: StaticScheduler, step_s: float = 1.0
            ) -> list[StepPlan]:
    recorder = SpyRecorder()  # every plan: one event per step (fast-forward records runs)
    simulate(iter(requests), sched, FixedLatency(step_s), recorder, fast_forward=False)
    return [plan for _, _, plan in recorder.steps]


# -- static by hand ----------------------------------------------------------------

def test_static_batch_runs_until_its_longest_member_and_pads_the_rest() -> None:
    a, b, c = Request(0, 0.0, 5, 2), Request(1, 0.0, 8, 4), Request(2, 0.0, 3, 1)
    late = Request(3, 0.5, 4, 2)  # arrives while the batch runs: must not join it
    sched = StaticScheduler(pool(), batch_size=3, max_model_len=64)
    plans = sim_run([a, b, c, late], sched)

    first = plans[:4]  # b's 4 outputs: one prefill, then three decodes
    assert [p.request_ids for p in first] == [(0, 1, 2), (0, 1), (1,), (1,)]
    assert (c.finish_s, a.finish_s, b.finish_s) == (1.0, 2.0, 4.0)
    # hand count: c idles in steps 2-4 (3 slot-steps), a in steps 3-4 (2)
    assert padded_slot_steps(first) == 3 + 2
    assert all(p.shape.padded_batch == 3 for p in plans)
    # the prefill pads every prompt to the longest (8); the plan keeps the real ones
    prefill = first[0]
    assert prefill.shape.prefill_chunk_tokens == (8, 8, 8)
    assert prefill.num_new_tokens == (5, 8, 3) and prefill.emits_token == (True,) * 3
    # decodes attend over contexts padded to the longest prompt too: 8 + tokens so far
    assert first[1].context_tokens == (5, 8)
    assert (first[1].shape.decode_context_sum, first[1].shape.decode_context_max) == (16, 8)
    assert first[2].shape.decode_context_sum == 9
    # the late request launches only when the batch is done, alone (arrivals ended),
    # still padded to B = 3: a prefill and one decode with 2 empty slots each
    assert late.first_scheduled_s == 4.0 and late.finish_s == 6.0
    assert [p.request_ids for p in plans[4:]] == [(3,), (3,)]
    assert padded_slot_steps(plans) == 5 + 2 * 2
    assert sched.kv.num_used_blocks == 0


def test_static_waits_for_b_then_close_launches_a_short_batch() -> None:
    sched = StaticScheduler(pool(), batch_size=4, max_model_len=64)
    for i in range(2):
        sched.add(Request(i, 0.0, 10, 3), 0.0)
    assert sched.schedule(1.0) is None and sched.next_wakeup(1.0) is None  # no timer
    sched.close(1.5)
    plan = sched.schedule(1.5)
    assert plan is not None and plan.request_ids == (0, 1) and plan.shape.padded_batch == 4


def test_static_launches_at_b_without_close() -> None:
    sched = StaticScheduler(pool(), batch_size=2, max_model_len=64)
    for i in range(3):
        sched.add(Request(i, 0.0, 10, 3), 0.0)
    plan = sched.schedule(0.0)
    assert plan.request_ids == (0, 1)
    sched.add(Request(9, 0.0, 10, 3), 0.0)
    while plan is not None and 9 not in plan.request_ids:
        assert set(plan.request_ids) <= {0, 1}  # nobody joins
        sched.on_step_done(plan, StepResult(), 1.0)
        plan = sched.schedule(1.0)
    assert plan.request_ids == (2, 9)  # the next batch: two waited, B = 2


def test_static_optional_max_wait_sets_a_deadline() -> None:
    sched = StaticScheduler(pool(), batch_size=4, max_wait_s=2.0, max_model_len=64)
    sched.add(Request(0, 1.0, 10, 3), 1.0)
    assert sched.next_wakeup(1.0) == 3.0
    assert sched.schedule(2.9) is None
    assert sched.schedule(3.0).shape.padded_batch == 4  # static still pads to B


def test_memory_short_batch_launches_what_fits() -> None:
    sched = StaticScheduler(pool(num_blocks=11, block_size=4), batch_size=4, max_model_len=16)
    for i in range(4):  # each reserves 16 tokens = 4 blocks of the 10
        sched.add(Request(i, 0.0, 6, 2), 0.0)
    assert sched.schedule(0.0).request_ids == (0, 1)


def test_request_level_schedulers_need_a_contiguous_pool_and_a_bound() -> None:
    with pytest.raises(TypeError, match="ContiguousAllocator"):
        StaticScheduler(PagedBlockManager(10, 4), max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len or max_output_tokens"):
        DynamicScheduler(pool())
    with pytest.raises(ValueError, match="needs max_wait_s"):
        DynamicScheduler(pool(), max_wait_s=None, max_model_len=64)  # type: ignore[arg-type]


# -- dynamic -------------------------------------------------------------------

def test_dynamic_launches_exactly_max_wait_after_the_oldest_arrival() -> None:
    a, b = Request(0, 0.25, 10, 3), Request(1, 0.5, 10, 3)
    late = Request(2, 10.0, 10, 3)  # the last arrival: dynamic does not launch at close
    sched = DynamicScheduler(pool(), batch_size=4, max_wait_s=0.5, max_model_len=64)
    plans = sim_run([a, b, late], sched, step_s=0.01)
    assert a.first_scheduled_s == b.first_scheduled_s == 0.25 + 0.5
    assert late.first_scheduled_s == 10.0 + 0.5
    assert plans[0].request_ids == (0, 1) and plans[0].shape.padded_batch == 2  # not B
    assert padded_slot_steps(plans) == 0  # equal outputs: nobody idles


@pytest.mark.parametrize("arrival_s, wait_s", [(0.1, 0.05), (1 / 3, 0.2), (7.7, 0.013)])
def test_dynamic_deadline_with_inexact_floats(arrival_s: float, wait_s: float) -> None:
    req = Request(0, arrival_s, 10, 2)
    sched = DynamicScheduler(pool(), batch_size=8, max_wait_s=wait_s, max_model_len=64)
    sim_run([req], sched, step_s=0.01)
    assert req.first_scheduled_s == pytest.approx(arrival_s + wait_s, abs=1e-12)


def test_dynamic_launches_at_b_at_once_and_late_waiters_go_next() -> None:
    reqs = [Request(i, 0.0, 10, 5) for i in range(3)] + [Request(3, 0.02, 10, 5)]
    sched = DynamicScheduler(pool(), batch_size=2, max_wait_s=1.0, max_model_len=64)
    sim_run(reqs, sched, step_s=0.01)
    starts = [r.first_scheduled_s for r in reqs]
    assert starts[:2] == [0.0, 0.0]
    # the first batch ends at 0.05; 2 and 3 are then a full batch
    assert starts[2:] == [pytest.approx(0.05)] * 2


# -- conservation on random workloads ----------------------------------------------

workloads = st.lists(st.tuples(st.floats(0, 3), st.integers(1, 120), st.integers(1, 40)),
                     min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(workloads, st.sampled_from(["static", "dynamic"]), st.integers(1, 6),
       st.sampled_from([None, 0.05, 0.5]), st.integers(6, 120), st.sampled_from([1, 4, 16]),
       st.sampled_from([None, 10, 40]))
def test_request_level_conservation(spec, policy, batch_size, wait_s, num_blocks, block_size,
                                    max_output) -> None:
    kv = ContiguousAllocator(num_blocks, block_size, watermark=0.01)
    if policy == "static":
        sched = StaticScheduler(kv, batch_size, wait_s, 150, max_output)
    else:
        sched = DynamicScheduler(kv, batch_size, wait_s or 0.05, 150, max_output)
    requests = [Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)]
    by_id = {r.request_id: r for r in requests}
    batch: list[Request] = []

    def check(plan: StepPlan, now: float) -> None:
        nonlocal batch
        assert plan.batch_size <= batch_size
        if not all(plan.is_prefill):
            assert not any(plan.is_prefill)
            assert set(plan.request_ids) <= {r.request_id for r in batch}, "a request joined"
            assert plan.shape.padded_batch == (batch_size if policy == "static" else len(batch))
            return
        # a prefill launches a batch: the last one must be over, and it must be due
        assert all(r.state is RequestState.FINISHED for r in batch), "launched while running"
        batch = [by_id[rid] for rid in plan.request_ids]
        pad = batch_size if policy == "static" else plan.batch_size
        assert plan.shape.padded_batch == pad
        oldest = min(r.arrival_s for r in batch)
        timer = wait_s if policy == "static" else wait_s or 0.05
        due = (len(batch) == batch_size or sched.num_waiting > 0  # full, or memory-short
               or (timer is not None and now >= oldest + timer - 1e-9)
               or (policy == "static" and sched.closed))
        assert due, f"a short batch launched early at {now}"

    done, plans = run_steps(sched, requests, check=check, after=sched.kv.check_invariants)
    assert sorted(r.request_id for r in done) == list(range(len(requests)))  # each once
    for r in requests:
        if r.state is RequestState.REJECTED:
            assert r.rejection_reason
        else:
            assert r.state is RequestState.FINISHED and r.num_output_done == r.output_tokens
            assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s
    emitted = sum(p.emits_token.count(True) for p in plans)
    assert emitted == sum(r.output_tokens for r in requests if r.state is RequestState.FINISHED)
    assert kv.num_used_blocks == 0 and not sched.has_unfinished()


@settings(max_examples=40, deadline=None)
@given(workloads, st.sampled_from(["static", "dynamic"]), st.integers(1, 6),
       st.sampled_from([None, 0.02, 0.3]), st.integers(6, 120), st.sampled_from([1, 4, 16]))
def test_request_level_conservation_through_simpy(spec, policy, batch_size, wait_s, num_blocks,
                                                  block_size) -> None:
    """The SimPy world's timers, wake-ups and close() end every run with every request done."""
    kv = ContiguousAllocator(num_blocks, block_size, watermark=0.01)
    if policy == "static":
        sched = StaticScheduler(kv, batch_size, wait_s, 150)
    else:
        sched = DynamicScheduler(kv, batch_size, wait_s or 0.05, 150)
    requests = sorted((Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)),
                      key=lambda r: r.arrival_s)
    recorder = SpyRecorder()
    done: list[int] = []
    simulate(iter(requests), sched, FixedLatency(0.01), recorder, on_done=done.append,
             fast_forward=False)  # the spy counts tokens from every plan
    summary = recorder.summary()
    finished = [r for r in requests if r.state is RequestState.FINISHED]
    assert sum(done) == len(requests) == summary["completed"] + summary["rejected"]
    assert all(r.rejection_reason for r in requests if r.state is RequestState.REJECTED)
    assert all(r.num_output_done == r.output_tokens for r in finished)
    assert recorder.tokens_emitted == sum(r.output_tokens for r in finished)
    assert kv.num_used_blocks == 0 and not sched.has_unfinished()


# -- scenarios end to end ---------------------------------------------------------

SMALL = """
workload:
  arrivals: {process: poisson, rate: 20}
  prompt_tokens: {dist: uniform, low: 50, high: 400}
  output_tokens: {dist: uniform, low: 5, high: 60}
  num_requests: 40
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("overrides", [
    ("scheduler.policy=static", "scheduler.batch_size=8"),
    ("scheduler.policy=dynamic", "scheduler.max_wait_ms=20"),
    ("scheduler.policy=continuous", "kv.mode=contiguous"),
])
def test_policies_run_end_to_end(tmp_path: Path, overrides: tuple[str, ...]) -> None:
    scenario, base_dir = load_scenario(write(tmp_path, SMALL), overrides)
    result = run_scenario(scenario, base_dir, show_progress=False)
    assert result.summary["completed"] == 40 and result.summary["rejected"] == 0
    assert scenario.kv_mode == "contiguous"
    paged, _ = load_scenario(write(tmp_path, SMALL))
    assert paged.kv_mode == "paged"
    # the same budget sizes both pools
    assert build_block_manager(scenario, kv_budget(scenario)).num_usable_blocks == (
        build_block_manager(paged, kv_budget(paged)).num_usable_blocks) == result.num_blocks


def test_static_is_slower_than_continuous_on_the_same_stream(tmp_path: Path) -> None:
    ends = {}
    for policy in ("static", "continuous"):
        scenario, base_dir = load_scenario(write(tmp_path, SMALL),
                                           (f"scheduler.policy={policy}",))
        ends[policy] = run_scenario(scenario, base_dir, show_progress=False).summary
    assert ends["static"]["median_ttft_ms"] > ends["continuous"]["median_ttft_ms"]


@pytest.mark.parametrize("text, expected", [
    ("scheduler: {policy: static}\nkv: {mode: paged}\n",
     "scenario.yaml: kv.mode: static batching reserves each request's KV up front and runs "
     "only on contiguous (or omit kv.mode), got 'paged'"),
    ("scheduler: {policy: dynamic}\nkv: {mode: paged}\n", "kv.mode: dynamic batching"),
    ("scheduler: {policy: greedy}\n",
     "scheduler.policy: Input should be 'continuous', 'static' or 'dynamic' (got 'greedy')"),
    ("scheduler: {policy: dynamic, max_wait_ms: -5}\n",
     "scheduler.max_wait_ms: Input should be greater than 0 (got -5)"),
    ("kv: {mode: pages}\n", "kv.mode: Input should be 'paged' or 'contiguous' (got 'pages')"),
    ("scheduler: {batch_size: 0}\n", "scheduler.batch_size: Input should be greater than or"),
])
def test_bad_combinations_read_well(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, text))
    message = str(info.value)
    assert expected in message and "\n" not in message
    assert "(top level)" not in message and "Value error" not in message


def test_static_prefill_padding_costs_roofline_time() -> None:
    latency = RooflineLatency(get_model("llama-3-8b"), get_hardware("h100-sxm"))
    reqs = [Request(0, 0.0, 2000, 2), Request(1, 0.0, 100, 2)]
    times = []
    for pad in (True, False):
        sched = StaticScheduler(pool(4000, 16), batch_size=2, max_model_len=8192,
                                pad_prompts=pad)
        for r in reqs:
            sched.add(Request(r.request_id, 0.0, r.prompt_tokens, r.output_tokens), 0.0)
        times.append(latency.step_time(sched.schedule(0.0).shape))
    assert times[0] > 1.5 * times[1]
