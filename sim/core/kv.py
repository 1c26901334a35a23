"""Paged KV-cache memory: fixed-size blocks, refcounts, a free queue, a null block.

Block 0 is the null block: never handed out, it is where padding rows write.
Free blocks sit in an ordered queue (oldest freed first) so that, once prefix
caching names blocks by content, reuse evicts the least recently used.
Block tables are tuples, rebuilt only when a block is added (every
`block_size` tokens), so a step plan can hold them without copying.

The free queue is a FIFO list consumed from a moving head, so whole tables
are taken with C-speed slices: a request allocates and frees ~100 blocks, and
an OrderedDict popped one block at a time cost more than the rest of the
simulation. Refcounts are stored (shared prefix blocks will need them); a
block returns to the queue only when its count drops to zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

NULL_BLOCK = 0


def num_kv_blocks(
    memory_bytes: float,
    memory_utilization: float,
    weights_bytes: float,
    activation_reserve_bytes: float,
    kv_bytes_per_token: float,
    block_size: int,
) -> int:
    """Blocks that fit in (memory x utilisation - weights - activations) / bytes per block."""
    free_bytes = memory_bytes * memory_utilization - weights_bytes - activation_reserve_bytes
    if free_bytes <= 0:
        return 0
    return int(free_bytes // (kv_bytes_per_token * block_size))


@dataclass(frozen=True, slots=True)
class KVBudget:
    """How the pool was sized, kept so reports can show every term."""

    memory_bytes: float
    memory_utilization: float
    weights_bytes: float
    activation_reserve_bytes: float
    kv_bytes_per_token: float
    block_size: int

    @property
    def num_blocks(self) -> int:
        return num_kv_blocks(self.memory_bytes, self.memory_utilization, self.weights_bytes,
                             self.activation_reserve_bytes, self.kv_bytes_per_token,
                             self.block_size)


class KVManager(Protocol):
    """What schedulers call on a KV pool: PagedBlockManager or ContiguousAllocator.

    `allocate`'s `reserve_tokens` is the request's peak (prompt + maximum output):
    the paged pool ignores it and grows block by block; a contiguous pool reserves
    it up front, as servers before paging did.
    """

    num_blocks: int
    block_size: int
    watermark_blocks: int

    @property
    def num_usable_blocks(self) -> int: ...

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_used_blocks(self) -> int: ...

    def blocks_for(self, num_tokens: int) -> int: ...

    def peak_tokens(self, max_kv_tokens: int, reserve_tokens: int | None) -> int: ...

    def block_table(self, request_id: int) -> tuple[int, ...]: ...

    def allocate(self, request_id: int, num_tokens: int, use_watermark: bool = True,
                 reserve_tokens: int | None = None) -> int: ...

    def append_slots(self, request_id: int, num_tokens: int) -> tuple[int, ...] | None: ...

    def append_block_each(self, request_ids: list[int]) -> list[tuple[int, ...]] | None: ...

    def free(self, request_id: int) -> None: ...

    def check_invariants(self) -> None: ...


class PagedBlockManager:
    """Hands out KV blocks to requests; `num_blocks` counts the null block too."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01,
                 enable_prefix_cache: bool = False) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is the null block), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        if enable_prefix_cache:
            raise NotImplementedError("prefix caching is not implemented yet")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = int(watermark * (num_blocks - 1))
        # the free queue is _free[_head:], oldest freed first; the consumed prefix is
        # dropped once it outweighs the live part, so memory stays O(num_blocks)
        self._free: list[int] = list(range(1, num_blocks))
        self._head = 0
        self._refcounts = [0] * num_blocks
        self._tables: dict[int, tuple[int, ...]] = {}

    # -- sizes ---------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) - self._head

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - len(self._free) + self._head

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def peak_tokens(self, max_kv_tokens: int, reserve_tokens: int | None) -> int:
        """Token slots a request holds at its peak: paging allocates only what is written."""
        return max_kv_tokens

    def block_table(self, request_id: int) -> tuple[int, ...]:
        return self._tables.get(request_id, ())

    def num_slots(self, request_id: int) -> int:
        """Token slots the request's table covers."""
        return len(self._tables.get(request_id, ())) * self.block_size

    # -- operations ----------------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int, use_watermark: bool = True,
                 reserve_tokens: int | None = None) -> int:
        """Give a new request blocks for `num_tokens`; returns tokens found in cache (or -1).

        -1 means not enough free blocks (above the watermark); nothing changes.
        The cached-token count is 0 until prefix caching names blocks.
        `reserve_tokens` is ignored: paging grows tables as tokens are written.
        """
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already holds blocks")
        needed = self.blocks_for(num_tokens)
        reserve = self.watermark_blocks if use_watermark else 0
        if len(self._free) - self._head - needed < reserve:
            return -1
        self._tables[request_id] = self._take(needed)
        return 0

    def append_slots(self, request_id: int, num_tokens: int) -> tuple[int, ...] | None:
        """Grow the request's table to cover `num_tokens`; returns it, or None if blocks ran out.

        Called for every running sequence every step, so the common case (the last
        block still has room) is one dict lookup and a comparison.
        """
        table = self._tables[request_id]
        missing = -(-num_tokens // self.block_size) - len(table)
        if missing <= 0:
            return table
        if missing > len(self._free) - self._head:
            return None
        table = self._tables[request_id] = table + self._take(missing)
        return table

    def append_block_each(self, request_ids: list[int]) -> list[tuple[int, ...]] | None:
        """Add one block to each request's table, in order; returns the new tables.

        Same blocks as calling append_slots one request at a time, in one call for the
        decodes that crossed a block boundary this step. None if the pool runs short,
        and then nothing changes (the caller goes one by one and preempts).
        """
        if len(request_ids) > len(self._free) - self._head:
            return None
        tables = self._tables
        grown = []
        for request_id, block in zip(request_ids, self._take(len(request_ids)), strict=True):
            table = tables[request_id] = tables[request_id] + (block,)
            grown.append(table)
        return grown

    def free(self, request_id: int) -> None:
        """Return a request's blocks; freed blocks go to the back of the queue (LRU).

        The table's tail goes first: it is the least useful to a later prefix hit.
        """
        refcounts = self._refcounts
        released = []
        for block in reversed(self._tables.pop(request_id, ())):
            refcounts[block] -= 1
            if not refcounts[block]:
                released.append(block)
        self._free.extend(released)

    def _take(self, count: int) -> tuple[int, ...]:
        head, free = self._head, self._free
        blocks = tuple(free[head:head + count])
        refcounts = self._refcounts
        for block in blocks:
            refcounts[block] = 1
        head += count
        if head > 4096 and 2 * head > len(free):
            del free[:head]
            head = 0
        self._head = head
        return blocks

    def refcount(self, block: int) -> int:
        return self._refcounts[block]

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is broken; for tests."""
        free_list = self._free[self._head:]
        free = set(free_list)
        assert len(free) == len(free_list), "a block is queued as free twice"
        holders: dict[int, int] = {}
        for table in self._tables.values():
            for b in table:
                holders[b] = holders.get(b, 0) + 1
        assert NULL_BLOCK not in holders and NULL_BLOCK not in free, "null block handed out"
        assert len(holders) + len(free) == self.num_usable_blocks, "free + used != total"
        assert not holders.keys() & free, "a block is both free and used"
        assert all(1 <= b < self.num_blocks for b in free), "free block id out of range"
        for b, count in enumerate(self._refcounts):
            assert count >= 0, f"block {b} refcount {count} < 0"
            assert count == holders.get(b, 0), f"block {b} refcount {count} != its holders"
        assert all(n == 1 for n in holders.values()), "a block shared without a prefix cache"
