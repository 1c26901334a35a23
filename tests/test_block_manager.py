"""PagedBlockManager accounting under any order of operations."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.core.kv import NULL_BLOCK, PagedBlockManager, num_kv_blocks
from sim.core.request import Request


def test_pool_size_from_memory_budget() -> None:
    gib = 1024**3
    # 80 GiB x 0.9 - 16 GiB weights - 2 GiB activations = 54 GiB; 2 MiB a 16-token block
    blocks = num_kv_blocks(80 * gib, 0.9, 16 * gib, 2 * gib, 131072, 16)
    assert blocks == int((80 * 0.9 - 18) * gib // (131072 * 16))
    assert num_kv_blocks(10 * gib, 0.9, 16 * gib, 0, 131072, 16) == 0


class QueueModel:
    """vLLM's free queue without prefix caching, as a plain list: slow and plainly right.

    Blocks are taken from the front; a freed table goes back to the front, its
    tail first (vllm/v1/core/block_pool.py: free_blocks prepends unnamed blocks).
    """

    def __init__(self, num_blocks: int) -> None:
        self.queue = list(range(1, num_blocks))  # block 0 is the null block
        self.tables: dict[int, list[int]] = {}

    def allocate(self, rid: int, blocks: int) -> bool:
        if blocks > len(self.queue):
            return False
        self.tables[rid], self.queue = self.queue[:blocks], self.queue[blocks:]
        return True

    def grow(self, rid: int, blocks: int) -> bool:
        missing = blocks - len(self.tables[rid])
        if missing > len(self.queue):
            return False
        if missing > 0:
            self.tables[rid] += self.queue[:missing]
            del self.queue[:missing]
        return True

    def free(self, rid: int) -> None:
        self.queue = self.tables.pop(rid)[::-1] + self.queue


def test_null_block_never_handed_out_and_freed_tail_reused_first() -> None:
    kv = PagedBlockManager(num_blocks=6, block_size=4, watermark=0.0)
    assert kv.allocate(1, 16) == 0  # four of the five usable blocks
    assert NULL_BLOCK not in kv.block_table(1) and kv.block_table(1) == (1, 2, 3, 4)
    assert kv.allocate(2, 8) == -1  # one block left, nothing changes
    kv.check_invariants()
    kv.free(1)
    # vLLM: an unnamed freed block goes to the front of the queue, the table's tail first
    assert kv.allocate(3, 12) == 0 and kv.block_table(3) == (4, 3, 2)
    assert kv.allocate(4, 8) == 0 and kv.block_table(4) == (1, 5)


def test_watermark_is_vllms_share_of_every_block() -> None:
    # vLLM: int(watermark * num_blocks), the null block counted; not int(wm * usable blocks)
    assert PagedBlockManager(num_blocks=10, block_size=1, watermark=0.1).watermark_blocks == 1
    assert PagedBlockManager(num_blocks=40, block_size=1, watermark=0.05).watermark_blocks == 2
    assert PagedBlockManager(num_blocks=10, block_size=1).watermark_blocks == 0  # vLLM's default


def test_full_sequence_check_refuses_what_only_its_first_chunk_fits() -> None:
    kv = PagedBlockManager(num_blocks=11, block_size=4, watermark=0.0)  # 10 blocks
    assert kv.allocate(1, 24) == 0  # 6 blocks held, 4 free
    # a 40-token prompt's first chunk of 8 fits, but all 40 (10 blocks) do not
    assert kv.allocate(2, 8, full_sequence_tokens=40) == -1
    assert kv.num_free_blocks == 4 and kv.block_table(2) == ()
    assert kv.allocate(2, 8, full_sequence_tokens=16) == 0  # 4 blocks: fits exactly
    assert kv.num_free_blocks == 2
    kv.check_invariants()


def test_watermark_holds_back_admission_but_not_growth() -> None:
    kv = PagedBlockManager(num_blocks=10, block_size=1, watermark=0.2)  # 2 blocks held back
    assert kv.allocate(1, 7) == 0
    assert kv.allocate(2, 1) == -1
    assert kv.allocate(2, 1, use_watermark=False) == 0
    assert kv.append_slots(1, 8) is not None
    assert kv.append_slots(1, 10) is None
    kv.check_invariants()


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = PagedBlockManager(num_blocks=33, block_size=4, watermark=0.05)
        # vLLM's queue as a plain list, fed the same operations: block ids must match
        self.ref = QueueModel(33)
        self.tokens: dict[int, int] = {}
        self.next_id = 0

    @rule(num_tokens=st.integers(1, 80))
    def allocate(self, num_tokens: int) -> None:
        before = self.kv.num_free_blocks
        rid = self.next_id
        self.next_id += 1
        ok = self.kv.allocate(rid, num_tokens)
        room = self.kv.blocks_for(num_tokens) + self.kv.watermark_blocks <= before
        assert (ok >= 0) == room
        if room:
            assert self.ref.allocate(rid, self.kv.blocks_for(num_tokens))
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
        assert (table is not None) == self.ref.grow(rid, self.kv.blocks_for(
            self.tokens[rid] + extra))
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
        if self.kv.allocate(rid, 1) >= 0:
            assert self.ref.allocate(rid, 1)
            self.tokens[rid] = 1

    @invariant()
    def accounting(self) -> None:
        self.kv.check_invariants()
        blocks = sum(self.kv.blocks_for(n) for n in self.tokens.values())
        assert self.kv.num_used_blocks == blocks
        assert self.kv.num_free_blocks == len(self.ref.queue)
        for rid in self.tokens:
            assert list(self.kv.block_table(rid)) == self.ref.tables[rid]

    def teardown(self) -> None:
        for rid in list(self.tokens):
            self.kv.free(rid)
        self.kv.check_invariants()
        assert self.kv.num_free_blocks == self.kv.num_usable_blocks, "blocks leaked"


TestBlockManagerMachine = BlockManagerMachine.TestCase


def test_free_queue_over_many_cycles_is_vllms() -> None:
    """Enough churn to wrap the named blocks' FIFO many times over, against a plain list.

    With prefix caching every full block is named, so freed blocks go to the
    back (LRU) and the partial tail block to the front; no two requests share
    content here, so the model needs no refcounts.
    """
    bs = 2
    kv = PagedBlockManager(50, bs, 0.0, enable_prefix_cache=True)
    queue, tables, named = list(range(1, 50)), {}, set()
    live: list[int] = []
    for rid in range(20_000):
        size = 1 + (rid * 7919) % 60
        req = Request(rid, 0.0, size, 1, prompt_token_ids=tuple(range(rid, rid + size)))
        blocks = kv.blocks_for(size)
        hits = kv.allocate(rid, size, request=req)
        assert (hits >= 0) == (blocks <= len(queue)) and hits <= 0
        if hits == 0:
            kv.cache_computed(rid, size)
            tables[rid], queue = queue[:blocks], queue[blocks:]
            named -= set(tables[rid])
            named |= set(tables[rid][:size // bs])
            live.append(rid)
            assert list(kv.block_table(rid)) == tables[rid]
        while len(queue) < 20 and live:
            victim = live.pop((rid * 31) % len(live))
            kv.free(victim)
            freed = tables.pop(victim)[::-1]
            queue = [b for b in freed if b not in named] + queue + [b for b in freed if b in named]
    kv.check_invariants()
    assert kv.num_free_blocks == len(queue)
    assert kv._queue.num_entries < 5_000, "the consumed prefix of the free queue is never dropped"


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


def test_without_a_prefix_cache_each_held_block_has_one_holder() -> None:
    """Refcounts are left to the tables when nothing can share a block: 1 held, 0 free."""
    kv = PagedBlockManager(20, 4)
    assert kv.allocate(1, 9) == 0 and kv.allocate(2, 4) == 0
    kv.cache_computed(1, 8)  # names nothing without the cache
    assert kv.num_cached_blocks == 0
    held = kv.block_table(1) + kv.block_table(2)
    assert [kv.refcount(b) for b in held] == [1] * 4
    kv.free(1)
    assert [kv.refcount(b) for b in held] == [0, 0, 0, 1]
    assert kv.allocate(3, 12) == 0
    assert kv.block_table(3) == held[2::-1]  # the freed table's tail reused first
    kv.check_invariants()
