"""PagedBlockManager accounting under any order of operations."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.core.kv import NULL_BLOCK, PagedBlockManager, num_kv_blocks


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
    assert kv.append_slots(1, 9)
    assert not kv.append_slots(1, 11)
    kv.check_invariants()


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kv = PagedBlockManager(num_blocks=33, block_size=4, watermark=0.05)
        self.tokens: dict[int, int] = {}
        self.next_id = 0

    @rule(num_tokens=st.integers(1, 80))
    def allocate(self, num_tokens: int) -> None:
        before = self.kv.num_free_blocks
        rid = self.next_id
        self.next_id += 1
        if self.kv.allocate(rid, num_tokens) >= 0:
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
        if self.kv.append_slots(rid, self.tokens[rid] + extra):
            self.tokens[rid] += extra
            assert self.kv.block_table(rid)[: len(table_before)] == table_before
        else:
            assert self.kv.block_table(rid) == table_before

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.kv.free(rid)
        del self.tokens[rid]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def preempt_latest(self, data: st.DataObject) -> None:
        """Recompute preemption: drop the newest request's KV and re-admit it from scratch."""
        rid = max(self.tokens)
        self.kv.free(rid)
        del self.tokens[rid]
        if self.kv.allocate(rid, 1) >= 0:
            self.tokens[rid] = 1

    @invariant()
    def accounting(self) -> None:
        self.kv.check_invariants()
        blocks = sum(self.kv.blocks_for(n) for n in self.tokens.values())
        assert self.kv.num_used_blocks == blocks

    def teardown(self) -> None:
        for rid in list(self.tokens):
            self.kv.free(rid)
        self.kv.check_invariants()
        assert self.kv.num_free_blocks == self.kv.num_usable_blocks, "blocks leaked"


TestBlockManagerMachine = BlockManagerMachine.TestCase
