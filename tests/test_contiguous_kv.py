"""Contiguous KV reservations: first-fit accounting, measured waste, and paged waste bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler, StaticScheduler


def live_tokens(plan: StepPlan) -> int:
    """Tokens whose KV exists once the step has run: context + new, per sequence."""
    return sum(plan.context_tokens) + sum(plan.num_new_tokens)


# -- the allocator by hand ------------------------------------------------------

def test_first_fit_reuses_the_lowest_hole_and_fragmentation_is_real() -> None:
    kv = ContiguousAllocator(num_blocks=11, block_size=4, watermark=0.0)  # blocks 1..10
    assert kv.allocate(0, 4, reserve_tokens=12) == 0  # 3 blocks: 1-3
    assert kv.allocate(1, 4, reserve_tokens=8) == 0  # 4-5
    assert kv.allocate(2, 4, reserve_tokens=12) == 0  # 6-8
    assert kv.block_table(0) == (1,) and kv.block_table(2) == (6,)  # a prefix of the run
    assert kv.reserved_slots(0) == 12 and kv.num_slots(0) == 4
    kv.free(1)
    kv.free(0)  # frees merge: one hole 1-5, and 9-10 stays apart
    kv.check_invariants()
    assert kv.num_holes == 2 and kv.largest_free_run == 5 and kv.num_free_blocks == 7
    assert kv.allocate(3, 1, reserve_tokens=8) == 0
    assert kv.block_table(3) == (1,)  # first fit: the lowest hole, from its front
    assert kv.allocate(4, 1, reserve_tokens=4 * 4) == -1  # 5 free blocks, largest run 3
    assert kv.num_free_blocks == 5 and kv.largest_free_run == 3
    kv.check_invariants()


def test_table_grows_inside_the_reservation_only() -> None:
    kv = ContiguousAllocator(num_blocks=9, block_size=4, watermark=0.0)
    kv.allocate(7, 5, reserve_tokens=12)
    assert kv.block_table(7) == (1, 2)
    assert kv.append_slots(7, 9) == (1, 2, 3)
    assert kv.append_slots(7, 13) is None  # past the reservation: a run never grows
    assert kv.append_blocks([7], 1) is None
    kv.allocate(8, 1, reserve_tokens=8)
    assert kv.append_blocks([8], 1) == [(4, 5)]
    assert kv.num_used_blocks == 5 and kv.num_free_blocks == 3
    kv.check_invariants()


def test_watermark_holds_back_admission() -> None:
    kv = ContiguousAllocator(num_blocks=11, block_size=1, watermark=0.2)  # 2 of 10 held back
    assert kv.allocate(0, 1, reserve_tokens=8) == 0
    assert kv.allocate(1, 1, reserve_tokens=1) == -1
    assert kv.allocate(1, 1, use_watermark=False, reserve_tokens=2) == 0
    assert kv.num_free_blocks == 0


# -- the allocator under any order of operations --------------------------------

class ContiguousMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = ContiguousAllocator(num_blocks=41, block_size=4, watermark=0.05)
        self.runs: dict[int, tuple[int, int]] = {}  # the model: request -> (first, blocks)
        self.next_id = 0

    def holes(self) -> list[tuple[int, int]]:
        """The free runs the model implies, in address order."""
        holes, position = [], 1
        for start, length in sorted(self.runs.values()):
            if start > position:
                holes.append((position, start - position))
            position = start + length
        if position < self.kv.num_blocks:
            holes.append((position, self.kv.num_blocks - position))
        return holes

    @rule(num_tokens=st.integers(1, 30), extra=st.integers(0, 60), watermark=st.booleans())
    def allocate(self, num_tokens: int, extra: int, watermark: bool) -> None:
        rid = self.next_id
        self.next_id += 1
        needed = self.kv.blocks_for(num_tokens + extra)
        fits = [start for start, length in self.holes() if length >= needed]
        free = sum(length for _, length in self.holes())
        room = free - needed >= (self.kv.watermark_blocks if watermark else 0)
        ok = self.kv.allocate(rid, num_tokens, watermark, reserve_tokens=num_tokens + extra)
        if fits and room:
            assert ok == 0
            start = self.kv.block_table(rid)[0]
            assert start == fits[0], "not first fit"
            self.runs[rid] = (start, needed)
            assert len(self.kv.block_table(rid)) == self.kv.blocks_for(num_tokens)
        else:
            assert ok == -1 and self.kv.block_table(rid) == ()

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def grow(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.runs)))
        start, reserved = self.runs[rid]
        tokens = data.draw(st.integers(1, (reserved + 1) * self.kv.block_size))
        table = self.kv.append_slots(rid, tokens)
        if self.kv.blocks_for(tokens) > reserved:
            assert table is None
        else:
            assert table is not None and table[:1] == (start,)
            assert len(table) >= self.kv.blocks_for(tokens)

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.runs)))
        self.kv.free(rid)
        del self.runs[rid]

    @rule()
    def free_all(self) -> None:
        for rid in list(self.runs):
            self.kv.free(rid)
        self.runs.clear()
        assert self.kv.num_free_blocks == self.kv.largest_free_run == self.kv.num_usable_blocks
        assert self.kv.num_holes == 1, "nothing leaks: one hole spans the pool"

    @invariant()
    def accounting(self) -> None:
        self.kv.check_invariants()
        used = sum(length for _, length in self.runs.values())
        assert self.kv.num_used_blocks == used
        assert self.kv.num_free_blocks + used == self.kv.num_usable_blocks
        spans = sorted(self.runs.values())
        for (a, n), (b, _) in zip(spans, spans[1:], strict=False):
            assert a + n <= b, "reservations overlap"
        assert [(s, n) for s, n in self.holes()] == [
            (s, self.kv._hole_len[s]) for s in self.kv._hole_starts]


TestContiguousMachine = ContiguousMachine.TestCase
TestContiguousMachine.settings = settings(max_examples=80, stateful_step_count=40,
                                          deadline=None)


# -- measured waste --------------------------------------------------------------

def test_static_contiguous_waste_equals_the_hand_count() -> None:
    """Reserve prompt + 8: A 10+8=18 -> 5 blocks, B 6+8=14 -> 4 blocks: 36 slots held."""
    kv = ContiguousAllocator(num_blocks=101, block_size=4, watermark=0.0)
    sched = StaticScheduler(kv, batch_size=2, max_output_tokens=8, max_model_len=1000)
    a, b = Request(0, 0.0, 10, 3), Request(1, 0.0, 6, 5)
    sched.add(a, 0.0)
    sched.add(b, 0.0)
    wastes = []
    for step in range(5):
        plan = sched.schedule(float(step))
        wastes.append(sched.kv_slots_held - live_tokens(plan))
        sched.on_step_done(plan, StepResult(), step + 1.0)
    # live: 10+6, 11+7, 12+8; then A is done: its run stays reserved but holds nothing
    # live, so only B's 9, then 10, tokens count
    assert wastes == [36 - 16, 36 - 18, 36 - 20, 36 - 9, 36 - 10]
    assert a.finish_s == 3.0 and b.finish_s == 5.0
    assert sched.kv_slots_held == 0 and not sched.has_unfinished()


def test_continuous_on_contiguous_reserves_up_to_max_model_len_by_default() -> None:
    """No output cap: each admission reserves max_model_len (64) tokens; paged holds ~live."""
    held = {}
    for pool in (ContiguousAllocator, PagedBlockManager):
        kv = pool(num_blocks=41, block_size=4, watermark=0.0)
        sched = ContinuousScheduler(kv, max_num_seqs=4, max_num_batched_tokens=64,
                                    max_model_len=64)
        sched.add(Request(0, 0.0, 10, 3), 0.0)
        sched.add(Request(1, 0.0, 5, 3), 0.0)
        plan = sched.schedule(0.0)
        held[pool.__name__] = sched.kv_slots_held - live_tokens(plan)
    # contiguous: 2 x 64 reserved - 15 live; paged: 3 + 2 blocks = 20 slots - 15 live
    assert held == {"ContiguousAllocator": 128 - 15, "PagedBlockManager": 20 - 15}


def test_reservation_that_can_never_fit_is_rejected_with_a_reason() -> None:
    kv = ContiguousAllocator(num_blocks=11, block_size=4)  # 40 slots
    sched = ContinuousScheduler(kv, 4, 64, max_model_len=64)
    small = Request(0, 0.0, 5, 3)
    assert not sched.add(small, 0.0)  # needs 7 KV tokens, but reserves max_model_len
    assert small.rejection_reason == "reserves 64 KV tokens (prompt + max output), pool holds 40"
    capped = ContinuousScheduler(ContiguousAllocator(11, 4), 4, 64, max_model_len=64,
                                 max_output_tokens=10)
    assert capped.add(Request(1, 0.0, 30, 10), 0.0)
    too_long = Request(2, 0.0, 5, 11)
    assert not capped.add(too_long, 0.0)
    assert too_long.rejection_reason == "output 11 > max_output_tokens 10"
    with pytest.raises(ValueError, match="max_model_len or max_output_tokens"):
        ContinuousScheduler(ContiguousAllocator(11, 4), 4, 64)


# -- paged never holds more than one partial block per sequence ------------------

workloads = st.lists(st.tuples(st.floats(0, 3), st.integers(1, 200), st.integers(1, 50)),
                     min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(workloads, st.integers(8, 120), st.sampled_from([1, 4, 16]), st.integers(1, 10),
       st.integers(16, 400))
def test_paged_holds_under_one_block_per_sequence_beyond_live_tokens(
        spec, num_blocks, block_size, max_seqs, budget) -> None:
    kv = PagedBlockManager(num_blocks, block_size, watermark=0.01)
    sched = ContinuousScheduler(kv, max_seqs, max(budget, max_seqs), True, 300)
    requests = [Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)]

    def check(plan: StepPlan, now: float) -> None:
        planned = set(plan.request_ids)
        # running sequences left out of the step (budget spent) hold their computed tokens
        idle = sum(r.num_computed_tokens for r in sched.running if r.request_id not in planned)
        waste = sched.kv_slots_held - live_tokens(plan) - idle
        assert 0 <= waste < block_size * max(1, sched.num_running)
        assert all(waste_of(kv, s.request_id, s.context_tokens + s.num_new_tokens) < block_size
                   for s in plan.seqs)

    done, _ = run_steps(sched, requests, check=check, after=sched.kv.check_invariants)
    assert len(done) == len(requests) and kv.num_used_blocks == 0


def waste_of(kv: PagedBlockManager, request_id: int, live: int) -> int:
    return kv.num_slots(request_id) - live


# -- conservation on a contiguous pool -------------------------------------------

@settings(max_examples=50, deadline=None)
@given(workloads, st.integers(8, 200), st.sampled_from([1, 4, 16]), st.integers(1, 8),
       st.one_of(st.none(), st.integers(1, 60)))
def test_continuous_on_contiguous_conserves_requests(spec, num_blocks, block_size, max_seqs,
                                                     max_output) -> None:
    kv = ContiguousAllocator(num_blocks, block_size, watermark=0.01)
    sched = ContinuousScheduler(kv, max_seqs, 256, True, 260, max_output_tokens=max_output)
    requests = [Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)]
    done, plans = run_steps(sched, requests, after=sched.kv.check_invariants)
    assert sorted(r.request_id for r in done) == list(range(len(requests)))  # each once
    for r in requests:
        if r.state is RequestState.REJECTED:
            assert r.rejection_reason
        else:
            assert r.state is RequestState.FINISHED and r.num_output_done == r.output_tokens
    assert not any(p.preempted_ids for p in plans), "reservations never run out"
    assert kv.num_used_blocks == 0 and kv.num_holes == 1
