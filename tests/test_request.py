"""The compact Request: a waiting one is its four numbers, the rest made when first needed."""

from hypothesis import given
from hypothesis import strategies as st

from sim.core.plan import StepResult
from sim.core.request import Request, RequestState
from sim.observe.diagnose import _Waiting


def test_a_fresh_request_reads_its_defaults_and_keeps_what_is_written() -> None:
    req = Request(7, 1.5, 300, 40)
    assert (req.state, req.first_scheduled_s, req.first_token_s, req.finish_s) == (
        RequestState.WAITING, None, None, None)
    assert (req.num_computed_tokens, req.num_output_done, req.spec_drafted,
            req.spec_accepted, req.num_preemptions, req.prefix_hit_tokens) == (0,) * 6
    assert (req.prompt_token_ids, req.prefix_block_ids, req.prefix_unit_tokens,
            req.rejection_reason) == (None, None, 512, None)
    req.num_output_done = 3
    req.first_token_s = 2.0
    req.state = RequestState.RUNNING
    assert (req.num_known_tokens, req.first_token_s, req.state) == (303, 2.0, RequestState.RUNNING)
    assert req.finish_s is None and not req.is_done
    req.reject("too long", 3.0)
    assert (req.state, req.rejection_reason, req.finish_s, req.is_done) == (
        RequestState.REJECTED, "too long", 3.0, True)


def test_rescripted_keeps_the_prompt_and_starts_afresh() -> None:
    req = Request(1, 4.0, 20, 9, prompt_token_ids=tuple(range(20)), prefix_block_ids=(5,),
                  prefix_unit_tokens=16)
    req.first_token_s = 5.0
    copy = req.rescripted(0.0, 3)
    assert (copy.request_id, copy.arrival_s, copy.prompt_tokens, copy.output_tokens) == (
        1, 0.0, 20, 3)
    assert (copy.prompt_token_ids, copy.prefix_block_ids, copy.prefix_unit_tokens) == (
        tuple(range(20)), (5,), 16)
    assert copy.first_token_s is None and req.first_token_s == 5.0


def readings(p: tuple | None) -> tuple:
    """A record's arrival, idle and KV clocks, queue ahead, running and prompt tokens, and the
    frontend's input time."""
    assert p is not None
    return tuple(p)


# a script of adds (True, an id step that may go back) and pops (False, an id, maybe absent)
scripts = st.lists(st.tuples(st.booleans(), st.integers(-3, 6)), max_size=300)


@given(scripts)
def test_waiting_records_come_back_as_a_map_would_return_them(script) -> None:  # noqa: ANN001
    """In order, out of order, ids falling back, absent ids, the cut at the head."""
    waiting, model = _Waiting(), {}
    rid = 0
    for is_add, step in script:
        if is_add:
            rid = max(0, rid + step)
            if rid in model:
                continue  # ids are unique
            values = (rid * 0.5, rid + 0.25, -rid * 1.0, rid, 2 * rid, 3 * rid + 1, rid / 8)
            waiting.add(rid, *values)
            model[rid] = values
        else:
            want = min(model, default=0) + abs(step) if step >= 0 else rid + 5
            got = waiting.pop(want)
            assert (None if got is None else readings(got)) == model.pop(want, None)
        assert len(waiting) == len(model)
    for rid in sorted(model):  # the rest, oldest first, as FCFS admits them
        assert readings(waiting.pop(rid)) == model.pop(rid)
    assert not len(waiting)


def test_a_long_queue_is_cut_at_its_head_and_keeps_the_skipped() -> None:
    waiting = _Waiting()
    for rid in range(5000):
        waiting.add(rid, rid * 0.5, 0.0, 0.0, rid, 0, rid + 1, rid * 1e-3)
    assert readings(waiting.pop(2)) == (1.0, 0.0, 0.0, 2, 0, 3, 2e-3)  # 0 and 1 go aside
    for rid in range(3, 4000):
        assert readings(waiting.pop(rid))[5] == rid + 1  # its prompt tokens
    assert waiting.pop(3) is None  # taken already
    assert [readings(waiting.pop(rid))[3] for rid in (1, 0, 4999)] == [1, 0, 4999]  # ahead
    assert len(waiting) == 999


def test_counters_come_back_from_a_running_set_and_read_as_one_tuple() -> None:
    from sim.core.kv import PagedBlockManager
    from sim.core.schedulers.continuous import ContinuousScheduler

    fresh = Request(7, 0.0, prompt_tokens=5, output_tokens=3)
    assert fresh.counters() == (0, 0, 0, 0)
    sched = ContinuousScheduler(PagedBlockManager(num_blocks=16, block_size=4),
                                max_num_seqs=4, max_num_batched_tokens=64)
    req = Request(1, 0.0, prompt_tokens=5, output_tokens=3)
    sched.add(req, 0.0)
    plan = sched.schedule(0.0)
    assert plan is not None and req.counters() == (0, 0, 0, 0)  # pre-step, while it runs
    sched.on_step_done(plan, StepResult(), 1.0)
    assert req.counters() == (5, 1, 0, 0)  # read from the running set's columns
    while not req.is_done:
        plan = sched.schedule(1.0)
        assert plan is not None
        sched.on_step_done(plan, StepResult(), 2.0)
    # finished: the set handed its counters back, and the request holds them itself
    assert req.counters() == (7, 3, 0, 0)
    assert (req.num_computed_tokens, req.num_output_done) == (7, 3)
    req.take_counters(1, 2, 3, 4)
    assert req.counters() == (1, 2, 3, 4) and req.spec_accepted == 4
