"""PagedBlockManager accounting under any order of operations."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from reference_scheduler import ReferencePagedBlockManager

from sim.core.kv import NULL_BLOCK, PagedBlockManager, num_kv_blocks
from sim.core.request import Request


def test_pool_size_from_memory_budget() -> None:
    gib = 1024**3
    # 80 GiB x 0.9 - 16 GiB weights - 2 GiB activations = 54 GiB; 2 MiB a 16-token block
    blocks = num_kv_blocks(80 * gib, 0.9, 16 * gib, 2 * gib, 131072, 16)
    assert blocks == int((80 * 0.9 - 18) * gib // (131072 * 16))
    assert num_kv_blocks(10 * gib, 0.9, 16 * gib, 0, 131072, 16) == 0


def test_null_block_never_handed_out_and_lru_order() -> None:
    kv = PagedBlockManager(num_blocks=5, block_size=4, watermark=0.0)
    assert kv.allocate(1, 16) == 0  # all four usable blocks
    assert NULL_BLOCK not in kv.block_table(1)
    assert kv.allocate(2, 1) == -1  # pool exhausted, nothing changes
    kv.check_invariants()
    first = kv.block_table(1)
    kv.free(1)
    assert kv.allocate(3, 4) == 0
    # freed in reverse: the table's tail is reused first
    assert kv.block_table(3) == (first[-1],)


def test_watermark_holds_back_admission_but_not_growth() -> None:
    kv = PagedBlockManager(num_blocks=11, block_size=1, watermark=0.2)  # 2 blocks held back
    assert kv.allocate(1, 8) == 0
    assert kv.allocate(2, 1) == -1
    assert kv.allocate(2, 1, use_watermark=False) == 0
    assert kv.append_slots(1, 9) is not None
    assert kv.append_slots(1, 11) is None
    kv.check_invariants()


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = PagedBlockManager(num_blocks=33, block_size=4, watermark=0.05)
        # the pre-FIFO implementation, fed the same operations: block ids must match
        self.ref = ReferencePagedBlockManager(num_blocks=33, block_size=4, watermark=0.05)
        self.tokens: dict[int, int] = {}
        self.next_id = 0

    @rule(num_tokens=st.integers(1, 80))
    def allocate(self, num_tokens: int) -> None:
        before = self.kv.num_free_blocks
        rid = self.next_id
        self.next_id += 1
        ok = self.kv.allocate(rid, num_tokens)
        assert ok == self.ref.allocate(rid, num_tokens)
        if ok >= 0:
            self.tokens[rid] = num_tokens
            assert self.kv.num_slots(rid) >= num_tokens
        else:
            assert self.kv.num_free_blocks == before
            assert self.kv.block_table(rid) == ()

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), extra=st.integers(1, 40))
    def append(self, data: st.DataObject, extra: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        table_before = self.kv.block_table(rid)
        table = self.kv.append_slots(rid, self.tokens[rid] + extra)
        assert table == self.ref.append_slots(rid, self.tokens[rid] + extra)
        if table is not None:
            self.tokens[rid] += extra
            assert self.kv.block_table(rid)[: len(table_before)] == table_before
        else:
            assert self.kv.block_table(rid) == table_before

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.kv.free(rid)
        self.ref.free(rid)
        del self.tokens[rid]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def preempt_latest(self, data: st.DataObject) -> None:
        """Recompute preemption: drop the newest request's KV and re-admit it from scratch."""
        rid = max(self.tokens)
        self.kv.free(rid)
        self.ref.free(rid)
        del self.tokens[rid]
        assert self.kv.allocate(rid, 1) == self.ref.allocate(rid, 1)
        if self.kv.block_table(rid):
            self.tokens[rid] = 1

    @invariant()
    def accounting(self) -> None:
        self.kv.check_invariants()
        blocks = sum(self.kv.blocks_for(n) for n in self.tokens.values())
        assert self.kv.num_used_blocks == blocks
        assert self.kv.num_free_blocks == self.ref.num_free_blocks
        for rid in self.tokens:
            assert self.kv.block_table(rid) == self.ref.block_table(rid)

    def teardown(self) -> None:
        for rid in list(self.tokens):
            self.kv.free(rid)
        self.kv.check_invariants()
        assert self.kv.num_free_blocks == self.kv.num_usable_blocks, "blocks leaked"


TestBlockManagerMachine = BlockManagerMachine.TestCase


def test_fifo_matches_reference_over_many_cycles() -> None:
    """Enough churn to wrap the free queue's consumed prefix many times over."""
    kv, ref = PagedBlockManager(50, 2, 0.0), ReferencePagedBlockManager(50, 2, 0.0)
    live: list[int] = []
    for rid in range(20_000):
        size = 1 + (rid * 7919) % 60
        assert kv.allocate(rid, size) == ref.allocate(rid, size)
        if kv.block_table(rid):
            live.append(rid)
            assert kv.block_table(rid) == ref.block_table(rid)
        while kv.num_free_blocks < 20 and live:
            victim = live.pop((rid * 31) % len(live))
            kv.free(victim)
            ref.free(victim)
    kv.check_invariants()
    assert kv.num_free_blocks == ref.num_free_blocks
    assert len(kv._free) < 5_000, "the consumed prefix of the free queue is never dropped"
    assert all(kv.refcount(b) == ref._refcounts[b] for b in range(kv.num_blocks))


def prefix_content(ids: tuple[int, ...], unit: int, end: int) -> tuple[tuple[int, int], ...]:
    """What tokens [0, end) hold: (prefix id, offset) per token; the test's side truth."""
    return tuple((ids[t // unit], t % unit) for t in range(end))


class SharedPrefixMachine(RuleBasedStateMachine):
    """Prefix caching on: requests share prefixes; a side map says what each block holds."""

    UNIT, BS = 8, 4

    def __init__(self) -> None:
        super().__init__()
        self.kv = PagedBlockManager(num_blocks=30, block_size=self.BS, watermark=0.0,
                                    enable_prefix_cache=True)
        self.live: dict[int, Request] = {}
        self.content: dict[int, tuple] = {}  # block -> the prefix it holds, once computed
        self.next_id = 0

    @rule(ids=st.lists(st.integers(0, 2), min_size=1, max_size=4), cut=st.integers(1, 8))
    def admit(self, ids: list[int], cut: int) -> None:
        unit, bs = self.UNIT, self.BS
        prompt = (len(ids) - 1) * unit + cut
        rid = self.next_id
        self.next_id += 1
        req = Request(rid, 0.0, prompt, 1, prefix_block_ids=tuple(ids), prefix_unit_tokens=unit)
        expected = self.kv.cached_prefix_tokens(req)
        before = self.kv.num_free_blocks
        hits = self.kv.allocate(rid, prompt, request=req)
        if hits < 0:
            assert self.kv.num_free_blocks == before and not self.kv.block_table(rid)
            return
        assert hits == expected and hits % bs == 0 and hits <= prompt - 1
        table = self.kv.block_table(rid)
        for i in range(hits // bs):  # a hit returns blocks holding exactly this prefix
            assert self.content[table[i]] == prefix_content(req.prefix_block_ids, unit,
                                                            (i + 1) * bs)
        self.live[rid] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def compute(self, data: st.DataObject) -> None:
        """The prefill ran: name the full prompt blocks; the side map learns their content."""
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live[rid]
        self.kv.cache_computed(rid, req.prompt_tokens)
        table = self.kv.block_table(rid)
        for i in range(req.prompt_tokens // self.BS):
            self.content[table[i]] = prefix_content(req.prefix_block_ids, self.UNIT,
                                                    (i + 1) * self.BS)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        held = {b: self.kv.block_hash(b) for r in self.live if r != rid
                for b in self.kv.block_table(r)}
        self.kv.free(rid)
        del self.live[rid]
        # then take blocks for fresh content: only refcount-0 blocks may lose their name
        if self.kv.allocate(-rid - 1, 2 * self.BS) >= 0:
            self.kv.free(-rid - 1)
        assert all(self.kv.block_hash(b) == name for b, name in held.items())

    @invariant()
    def accounting(self) -> None:
        self.kv.check_invariants()
        holders: dict[int, int] = {}
        for rid in self.live:
            for b in self.kv.block_table(rid):
                holders[b] = holders.get(b, 0) + 1
        for b, n in holders.items():
            assert self.kv.refcount(b) == n

    def teardown(self) -> None:
        for rid in list(self.live):
            self.kv.free(rid)
        self.kv.check_invariants()
        assert self.kv.num_free_blocks == self.kv.num_usable_blocks, "blocks leaked"


TestSharedPrefixMachine = SharedPrefixMachine.TestCase
