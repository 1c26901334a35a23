"""The continuous scheduler's async scheduling: vLLM's AsyncScheduler bookkeeping, unit by unit.

The parity suite (tests/test_vllm_parity.py) checks whole runs against vLLM's own
AsyncScheduler; these pin each rule on a small case, each by a number a wrong rule
changes: the optimistic count of the step in flight, the step a request whose running
step ends it is skipped, blocks freed only when that step is applied, the outputs a
preempted request still gets, names given when a step is applied, the one-plan-ahead
contract, and how a scenario's `scheduler.async_scheduling` resolves.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sim.assemble import scheduler_settings
from sim.config.scenario import Scenario
from sim.config.sections import SchedulerConfig
from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers import (
    ContinuousScheduler,
    DynamicScheduler,
    StaticScheduler,
    resolve_async_scheduling,
)

EMPTY = StepResult()


def sched(num_blocks: int = 64, *, async_scheduling: bool = True, prefix: bool = False,
          **kw) -> ContinuousScheduler:
    kv = PagedBlockManager(num_blocks, 16, enable_prefix_cache=prefix)
    return ContinuousScheduler(kv, async_scheduling=async_scheduling, **kw)


def test_the_next_step_counts_the_running_one_as_done() -> None:
    s = sched()
    s.add(Request(0, 0.0, 20, 5), 0.0)
    first = s.schedule(0.0)
    assert first.num_new_tokens == (20,) and first.emits_token == (True,)
    second = s.schedule(0.0)  # the prefill still runs: its token is a placeholder
    assert second.request_ids == (0,) and second.num_new_tokens == (1,)
    assert second.context_tokens == (20,) and not second.is_prefill[0]
    assert second.shape.num_decodes == 1 and not second.shape.prefill_chunk_tokens
    s.on_step_done(first, EMPTY, 1.0)
    assert s.running[0].num_output_done == 1 and s.running[0].num_computed_tokens == 20
    third = s.schedule(1.0)
    assert third.context_tokens == (21,)


def test_a_request_its_running_step_ends_is_skipped_and_keeps_its_blocks() -> None:
    s = sched()
    s.add(Request(0, 0.0, 20, 1), 0.0)  # one output token: the prefill's
    s.add(Request(1, 0.0, 20, 3), 0.0)
    first = s.schedule(0.0)
    free_before = s.kv.num_free_blocks
    second = s.schedule(0.0)
    assert second.request_ids == (1,)  # 0 skipped, 1 (after it) still runs
    assert s.kv.num_free_blocks == free_before  # 0's blocks held until its step is applied
    finished = s.on_step_done(first, EMPTY, 1.0)
    assert [r.request_id for r in finished] == [0]
    assert s.kv.num_free_blocks == free_before + 2
    # synchronous: the finished request's blocks are free at the next schedule()
    t = sched(async_scheduling=False)
    t.add(Request(0, 0.0, 20, 1), 0.0)
    t.on_step_done(t.schedule(0.0), EMPTY, 1.0)
    assert t.kv.num_free_blocks == t.kv.num_usable_blocks


def test_one_plan_ahead_and_in_order() -> None:
    s = sched()
    s.add(Request(0, 0.0, 20, 9), 0.0)
    first = s.schedule(0.0)
    second = s.schedule(0.0)
    with pytest.raises(RuntimeError, match="two plans outstanding"):
        s.schedule(0.0)
    with pytest.raises(ValueError, match="oldest outstanding"):
        s.on_step_done(second, EMPTY, 1.0)
    assert s.decode_run() is None  # nothing is fast-forwarded while a step runs
    s.on_step_done(first, EMPTY, 1.0)
    s.on_step_done(second, EMPTY, 2.0)
    assert s.running[0].num_output_done == 2
    assert s.async_scheduling and not sched(async_scheduling=False).async_scheduling


def test_a_preempted_request_still_gets_its_running_steps_output() -> None:
    # 4 usable blocks: two requests of 2 blocks each; a third block for 0 preempts 1
    s = sched(num_blocks=5)
    s.add(Request(0, 0.0, 31, 6), 0.0)
    s.add(Request(1, 0.0, 17, 2), 0.0)
    first = s.schedule(0.0)  # both prefill and emit; 1's output ends its script but one
    second = s.schedule(0.0)  # 0 decodes at 31: its 32nd token takes no block yet
    assert second.request_ids == (0, 1)
    s.on_step_done(first, EMPTY, 1.0)
    third = s.schedule(1.0)  # 0's token 33 needs a third block: 1 is preempted
    assert third.preempted_ids == (1,) and third.request_ids == (0,)
    victim = next(r for r in s.waiting if r.request_id == 1)
    assert victim.num_output_done == 1 and victim.num_computed_tokens == 0
    finished = s.on_step_done(second, EMPTY, 2.0)  # 1's output arrives: its second and last
    assert [r.request_id for r in finished] == [1]
    assert victim.state is RequestState.FINISHED and victim.finish_s == 2.0
    assert victim.num_output_done == 2 and not s.waiting


def test_blocks_filled_by_accepted_drafts_are_named_when_their_step_is_applied() -> None:
    def run(async_scheduling: bool) -> int | None:
        s = sched(prefix=True, async_scheduling=async_scheduling, speculative_tokens=4,
                  speculative_method="draft_model", max_model_len=64)
        s.add(Request(0, 0.0, 12, 6, prompt_token_ids=tuple(range(1, 13))), 0.0)
        first = s.schedule(0.0)
        s.on_step_done(first, EMPTY, 1.0)  # the prompt's token: 13 known, 12 computed
        verify = s.schedule(1.0)  # 1 + 4 drafts from 12: all accepted -> 17 computed
        assert verify.num_spec_tokens == (4,)
        table = s.kv.block_table(0)
        s.on_step_done(verify, StepResult(num_emitted=(5,)), 2.0)  # 6 outputs: finished
        return s.kv.block_hash(table[0])

    # vLLM's AsyncScheduler names the first block (16 delivered tokens) before freeing it;
    # its synchronous Scheduler frees it unnamed (it would name it at the next schedule)
    assert run(True) is not None
    assert run(False) is None


def test_abort_while_its_step_runs() -> None:
    s = sched()
    s.add(Request(0, 0.0, 20, 9), 0.0)
    s.add(Request(1, 0.0, 20, 9), 0.0)
    first = s.schedule(0.0)
    aborted = s.abort(0, 0.5)
    assert aborted is not None and s.kv.block_table(0) == ()
    assert s.on_step_done(first, EMPTY, 1.0) == []
    assert [r.request_id for r in s.running] == [1] and s.running[0].num_output_done == 1


def test_without_speculation_an_async_scheduler_driven_step_by_step_plans_as_a_sync_one() -> None:
    plans = []
    for async_scheduling in (False, True):
        s = sched(num_blocks=12, prefix=True, async_scheduling=async_scheduling,
                  max_num_batched_tokens=48, max_num_seqs=4)
        for i in range(8):
            s.add(Request(i, 0.0, 10 + 7 * i, 3 + i, prompt_token_ids=tuple(
                range(1 + i % 2, 11 + 7 * i + i % 2))), 0.0)
        mine = []
        while s.has_unfinished():
            plan = s.schedule(0.0)
            if plan is not None:
                mine.append(plan)
                s.on_step_done(plan, EMPTY, 1.0)
        plans.append(mine)
    assert plans[0] == plans[1] and len(plans[0]) > 10


def test_resolving_the_scenario_setting() -> None:
    assert resolve_async_scheduling(None, "continuous", "recompute", 0, "ngram")
    assert resolve_async_scheduling(None, "continuous", "recompute", 4, "draft_model")
    assert not resolve_async_scheduling(None, "continuous", "recompute", 4, "ngram")
    assert not resolve_async_scheduling(None, "continuous", "swap", 0, "ngram")
    assert not resolve_async_scheduling(None, "static", "recompute", 0, "ngram")
    assert not resolve_async_scheduling(False, "continuous", "recompute", 0, "ngram")
    with pytest.raises(ValueError, match=r"scheduler\.async_scheduling: true .*'ngram'"):
        resolve_async_scheduling(True, "continuous", "recompute", 4, "ngram")
    with pytest.raises(ValueError, match=r"scheduler\.async_scheduling: true .*swap"):
        resolve_async_scheduling(True, "continuous", "swap", 0, "ngram")
    with pytest.raises(ValueError, match="async_scheduling"):
        sched(speculative_tokens=2, speculative_method="ngram")


def test_the_scenario_field() -> None:
    assert SchedulerConfig().async_scheduling is None
    with pytest.raises(ValidationError, match=r"scheduler\.async_scheduling: true needs "
                                              r"policy continuous.*'static'"):
        SchedulerConfig(policy="static", async_scheduling=True)
    assert SchedulerConfig(policy="dynamic", async_scheduling=False).async_scheduling is False
    assert scheduler_settings(Scenario()).async_scheduling is True
    off = Scenario.model_validate({"scheduler": {"async_scheduling": False}})
    assert scheduler_settings(off).async_scheduling is False
    ngram = Scenario.model_validate({"speculative": {"num_tokens": 3}})
    assert scheduler_settings(ngram).async_scheduling is False
    static = Scenario.model_validate({"scheduler": {"policy": "static"}})
    assert scheduler_settings(static).async_scheduling is False


def test_request_level_batching_has_no_async_mode() -> None:
    kv = ContiguousAllocator(64, 16)
    assert StaticScheduler(kv, 4, max_model_len=100).async_scheduling is False
    assert DynamicScheduler(ContiguousAllocator(64, 16), 4, 0.05,
                            max_model_len=100).async_scheduling is False
