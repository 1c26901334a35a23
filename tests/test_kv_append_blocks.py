"""append_blocks deals a run's blocks in one call: the blocks one-at-a-time appends give.

A decode run hands each row all its blocks for the run at once (sim/core/schedulers/
batch_runs.py), and a plain step each crossing row one; both must take the same block ids
in the same order as step by step (the free queue interleaves LIFO frees and LRU names),
evict the same names and, with a prefix cache, give names between steps as step by step.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import PagedBlockManager
from sim.core.request import Request
from sim.core.schedulers.batch_runs import _take_blocks
from sim.core.schedulers.running_columns import COMPUTED

BS = 4


def pool_in_use(prefix: bool, seed: int, live: int, gone: int, num_blocks: int = 400
                ) -> tuple[PagedBlockManager, list[int], list[int]]:
    """A pool some requests left (their blocks queued front and, named, back) and `live`
    requests hold, each fully named up to its computed tokens; returns it, the live ids and
    their computed tokens."""
    rng = np.random.default_rng(seed)
    kv = PagedBlockManager(num_blocks, BS, enable_prefix_cache=prefix)
    rids, computed = [], []
    for rid in range(live + gone):
        tokens = int(rng.integers(1, 6 * BS))
        assert kv.allocate(rid, tokens, request=Request(rid, 0.0, tokens, 50)) == 0
        kv.cache_computed(rid, tokens)
        rids.append(rid)
        computed.append(tokens)
    for i in sorted(rng.choice(live + gone, gone, replace=False).tolist(), reverse=True):
        kv.free(rids.pop(i))
        del computed[i]
    return kv, rids, computed


def same_pool(a: PagedBlockManager, b: PagedBlockManager, rids: list[int]) -> None:
    a.check_invariants()
    b.check_invariants()
    assert [a.block_table(r) for r in rids] == [b.block_table(r) for r in rids]
    assert a._queue.blocks() == b._queue.blocks()  # noqa: SLF001 - the order reuse takes
    assert a._prefix.names == b._prefix.names  # noqa: SLF001
    assert a._prefix.cached == b._prefix.cached  # noqa: SLF001
    assert a._prefix.copies == b._prefix.copies  # noqa: SLF001
    assert a.num_evictions == b.num_evictions


@settings(max_examples=60, deadline=None)
@given(prefix=st.booleans(), seed=st.integers(0, 2**16), live=st.integers(1, 12),
       gone=st.integers(0, 12), rounds=st.integers(0, 5), extra=st.integers(0, 11))
def test_dealing_equals_one_block_at_a_time(prefix: bool, seed: int, live: int, gone: int,
                                            rounds: int, extra: int) -> None:
    kv, rids, _ = pool_in_use(prefix, seed, live, gone)
    extra %= live
    if not rounds and not extra:
        rounds = 1
    count = live * rounds + extra
    dealt = rids if rounds else rids[:extra]  # every request dealt gets one at least
    reference = copy.deepcopy(kv)
    grown = kv.append_blocks(dealt, count)
    for j in range(count):  # round after round, the requests in order
        rid = dealt[j % len(dealt)]
        assert reference.append_slots(rid, (len(reference.block_table(rid)) + 1) * BS)
    assert grown == [kv.block_table(r) for r in dealt]
    same_pool(kv, reference, rids)


def test_a_short_pool_deals_nothing() -> None:
    kv, rids, _ = pool_in_use(True, 1, 5, 3, num_blocks=40)
    before = copy.deepcopy(kv)
    assert kv.append_blocks(rids, kv.num_free_blocks + 1) is None
    same_pool(kv, before, rids)
    assert kv.append_blocks(rids[:2], 2 * kv.num_free_blocks) is None
    same_pool(kv, before, rids)


def step_by_step(kv: PagedBlockManager, rids: list[int], computed: list[int], steps: int,
                 naming: bool) -> list[int]:
    """Plain decode steps as an ordinary step gives blocks: the rows opening a block in row
    order, then the blocks the step fills named; the blocks in use during each step."""
    used = []
    for s in range(steps):
        for rid, c in zip(rids, computed, strict=True):
            if (c + s) % BS == 0:
                assert kv.append_slots(rid, c + s + 1) is not None
        if naming:
            for rid, c in zip(rids, computed, strict=True):
                if (c + s + 1) % BS == 0:
                    kv.cache_computed(rid, c + s + 1)
        used.append(kv.num_used_blocks)
    return used


@settings(max_examples=40, deadline=None)
@given(prefix=st.booleans(), seed=st.integers(0, 2**16), live=st.sampled_from([1, 3, 7, 40]),
       steps=st.sampled_from([1, 2, 3, 5, 8, 13, 70]))
def test_a_runs_blocks_equal_step_by_steps(prefix: bool, seed: int, live: int,
                                           steps: int) -> None:
    """Both phase orders (plain Python below 33 rows, numpy above) and both ways of counting
    blocks used (up to 64 steps and past)."""
    kv, rids, computed = pool_in_use(prefix, seed, live, 6, num_blocks=4000)
    reference = copy.deepcopy(kv)
    state = np.zeros((7, 2 * live), dtype=np.int64)
    state[COMPUTED, :live] = computed
    batch = SimpleNamespace(reqs=list(rids), rids=list(rids), block_size=BS, state=state,
                            tables=[kv.block_table(r) for r in rids])
    used = _take_blocks(batch, list(computed), steps, kv, True,  # type: ignore[arg-type]
                        kv if prefix else None)
    assert used.tolist() == step_by_step(reference, rids, computed, steps, prefix)
    assert batch.tables == [kv.block_table(r) for r in rids]
    same_pool(kv, reference, rids)


@pytest.mark.parametrize(("count", "shown"), [(2, [3, 3]), (3, [4, 3]), (4, [4, 4])])
def test_contiguous_deals_inside_the_reservations(count: int, shown: list[int]) -> None:
    kv = ContiguousAllocator(num_blocks=20, block_size=4)
    kv.allocate(0, 5, reserve_tokens=16)  # 2 blocks shown of 4
    kv.allocate(1, 1, reserve_tokens=16)  # 1 of 4
    kv.append_slots(1, 5)
    assert kv.append_blocks([0, 1], count) == [tuple(range(1, 1 + shown[0])),
                                               tuple(range(5, 5 + shown[1]))]
    kv.check_invariants()
    assert kv.append_blocks([0, 1], 4) is None  # past a reservation: nothing changes
    assert [len(kv.block_table(r)) for r in (0, 1)] == shown
