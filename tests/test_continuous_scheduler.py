"""The continuous scheduler driven with a virtual clock over random workloads."""

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.drive import default_step_s, run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler


def drive(sched: ContinuousScheduler, requests: list[Request],
          step_s: Callable[[StepShape], float] = default_step_s,
          check: Callable[[StepPlan], None] | None = None,
          ) -> tuple[list[Request], list[StepPlan]]:
    """sim.core.drive's virtual clock, the pool's invariants checked after every step."""
    return run_steps(sched, requests, step_s, None if check is None else lambda p, _: check(p),
                     sched.kv.check_invariants)


workloads = st.lists(
    st.tuples(st.floats(0, 5), st.integers(1, 300), st.integers(1, 60)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(workloads, st.integers(8, 80), st.sampled_from([1, 4, 16]), st.integers(1, 12),
       st.integers(16, 512), st.booleans())
def test_scheduler_properties(spec, num_blocks, block_size, max_seqs, budget, chunked) -> None:
    budget = max(budget, max_seqs)
    kv = PagedBlockManager(num_blocks, block_size, watermark=0.05)
    sched = ContinuousScheduler(kv, max_seqs, budget, chunked, max_model_len=400)
    requests = [Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)]

    def check(plan: StepPlan) -> None:
        assert plan.shape.num_tokens <= budget
        assert plan.batch_size <= max_seqs
        assert len(set(plan.request_ids)) == plan.batch_size
        assert not set(plan.preempted_ids) & set(plan.request_ids)

    done, _ = drive(sched, requests, check=check)
    assert sorted(r.request_id for r in done) == list(range(len(requests)))  # each once
    for r in requests:
        if r.state is RequestState.REJECTED:
            assert r.rejection_reason
        else:
            assert r.state is RequestState.FINISHED
            assert r.num_output_done == r.output_tokens
            # the world's arrival instant is the last one plus the gap, as SimPy adds it: it
            # may sit an ulp below the scripted arrival_s
            assert r.arrival_s <= r.first_scheduled_s + 1e-9
            assert r.first_scheduled_s <= r.first_token_s <= r.finish_s
    assert kv.num_used_blocks == 0


def test_tokens_and_emission_rule() -> None:
    """First token from the step completing the prompt, then one per decode step."""
    kv = PagedBlockManager(100, 16)
    sched = ContinuousScheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    req = Request(0, 0.0, prompt_tokens=150, output_tokens=5)
    done, plans = drive(sched, [req], step_s=lambda s: 1.0)
    # 150-token prompt in chunks of 64: 3 steps, the third emits; then 4 decodes
    assert [p.num_new_tokens[0] for p in plans] == [64, 64, 22, 1, 1, 1, 1]
    assert [p.emits_token[0] for p in plans] == [False, False, True, True, True, True, True]
    assert [p.shape.num_decodes for p in plans] == [0, 0, 0, 1, 1, 1, 1]
    assert req.first_token_s == 3.0 and req.finish_s == 7.0
    assert plans[-1].context_tokens[0] == 150 + 5 - 2


def test_no_chunking_waits_for_room_and_rejects_oversized() -> None:
    kv = PagedBlockManager(200, 16)
    sched = ContinuousScheduler(kv, max_num_seqs=8, max_num_batched_tokens=100,
                                chunked_prefill=False)
    big = Request(0, 0.0, 101, 3)
    assert not sched.add(big, 0.0) and "chunked prefill off" in big.rejection_reason
    a, b = Request(1, 0.0, 60, 3), Request(2, 0.0, 60, 3)
    sched.add(a, 0.0)
    sched.add(b, 0.0)
    plan = sched.schedule(0.0)
    assert plan.request_ids == (1,)  # b does not fit in the 40 tokens left, and is not chunked


def test_never_fitting_requests_are_rejected_with_reason() -> None:
    kv = PagedBlockManager(5, 16)  # 64 token slots
    sched = ContinuousScheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=80)
    too_long = Request(0, 0.0, 70, 20)
    too_big = Request(1, 0.0, 60, 10)
    assert not sched.add(too_long, 0.0) and "max_model_len" in too_long.rejection_reason
    assert not sched.add(too_big, 0.0) and "pool holds 64" in too_big.rejection_reason
    assert not sched.has_unfinished()


def test_preemption_takes_the_most_recent_and_recomputes() -> None:
    kv = PagedBlockManager(num_blocks=7, block_size=4, watermark=0.0)  # 24 slots
    sched = ContinuousScheduler(kv, max_num_seqs=4, max_num_batched_tokens=64)
    reqs = [Request(i, 0.0, 8, 10) for i in range(3)]  # 3 x 8 prompt tokens fill 6 blocks
    done, plans = drive(sched, reqs, step_s=lambda s: 1.0)
    preempting = [p for p in plans if p.preempted_ids]
    assert preempting, "memory pressure must preempt"
    assert preempting[0].preempted_ids == (2,)  # the last admitted goes first
    assert reqs[2].num_preemptions >= 1 and reqs[0].num_preemptions == 0
    # recompute: the victim's next prefill covers its prompt and the output it had
    recompute = next(p for p in plans[plans.index(preempting[0]) + 1:] if 2 in p.request_ids)
    k = recompute.request_ids.index(2)
    assert recompute.context_tokens[k] == 0 and recompute.num_new_tokens[k] > 8
    assert all(r.state is RequestState.FINISHED for r in reqs)
    assert sorted(r.request_id for r in done) == [0, 1, 2]


def test_same_inputs_same_plans() -> None:
    def run() -> list[StepPlan]:
        kv = PagedBlockManager(40, 8)
        sched = ContinuousScheduler(kv, 6, 48)
        reqs = [Request(i, 0.3 * i, 20 + 7 * i % 50, 5 + i % 9) for i in range(30)]
        return drive(sched, reqs)[1]

    assert run() == run()


def test_running_requests_counters_are_exact_between_steps() -> None:
    """They live in the running set's columns while running; the Request reads them there."""
    kv = PagedBlockManager(200, 4)
    sched = ContinuousScheduler(kv, 8, 64)
    reqs = [Request(i, 0.0, 10, 50) for i in range(4)]
    for r in reqs:
        sched.add(r, 0.0)
    for step in range(5):
        sched.on_step_done(sched.schedule(0.0), StepResult(), float(step + 1))
    assert [(r.num_computed_tokens, r.num_output_done) for r in reqs] == [(14, 5)] * 4
    # a plan that is not the one just scheduled is still applied exactly
    plan = sched.schedule(5.0)
    sched.schedule(5.0)
    sched.on_step_done(plan, StepResult(), 6.0)
    assert [(r.num_computed_tokens, r.num_output_done) for r in reqs] == [(15, 6)] * 4
