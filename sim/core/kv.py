"""Paged KV-cache memory: fixed-size blocks, refcounts, a free queue, a null block.

Block 0 is the null block: never handed out, it is where padding rows write.
Free blocks sit in an ordered queue (oldest freed first) so that, once prefix
caching names blocks by content, reuse evicts the least recently used.
Block tables are tuples, rebuilt only when a block is added (every
`block_size` tokens), so a step plan can hold them without copying.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

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
        self._refcounts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._tables: dict[int, tuple[int, ...]] = {}

    # -- sizes ---------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, request_id: int) -> tuple[int, ...]:
        return self._tables.get(request_id, ())

    def num_slots(self, request_id: int) -> int:
        """Token slots the request's table covers."""
        return len(self._tables.get(request_id, ())) * self.block_size

    # -- operations ----------------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int, use_watermark: bool = True) -> int:
        """Give a new request blocks for `num_tokens`; returns tokens found in cache (or -1).

        -1 means not enough free blocks (above the watermark); nothing changes.
        The cached-token count is 0 until prefix caching names blocks.
        """
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already holds blocks")
        needed = self.blocks_for(num_tokens)
        reserve = self.watermark_blocks if use_watermark else 0
        if len(self._free) - needed < reserve:
            return -1
        self._tables[request_id] = self._take(needed)
        return 0

    def append_slots(self, request_id: int, num_tokens: int) -> bool:
        """Grow the request's table to cover `num_tokens`; False (no change) if blocks ran out."""
        table = self._tables[request_id]
        missing = self.blocks_for(num_tokens) - len(table)
        if missing <= 0:
            return True
        if missing > len(self._free):
            return False
        self._tables[request_id] = table + self._take(missing)
        return True

    def free(self, request_id: int) -> None:
        """Return a request's blocks; freed blocks go to the back of the queue (LRU)."""
        refcounts, free = self._refcounts, self._free
        for block in reversed(self._tables.pop(request_id, ())):
            refcounts[block] -= 1
            if refcounts[block] == 0:
                free[block] = None

    def _take(self, count: int) -> tuple[int, ...]:
        refcounts, free = self._refcounts, self._free
        blocks = []
        for _ in range(count):
            block, _unused = free.popitem(last=False)
            refcounts[block] = 1
            blocks.append(block)
        return tuple(blocks)

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is broken; for tests."""
        used = {b for table in self._tables.values() for b in table}
        assert NULL_BLOCK not in used and NULL_BLOCK not in self._free, "null block handed out"
        assert len(used) + len(self._free) == self.num_usable_blocks, "free + used != total"
        assert not used & self._free.keys(), "a block is both free and used"
        holders: dict[int, int] = {}
        for table in self._tables.values():
            for b in table:
                holders[b] = holders.get(b, 0) + 1
        for b, count in enumerate(self._refcounts):
            assert count >= 0, f"block {b} refcount {count} < 0"
            assert count == holders.get(b, 0), f"block {b} refcount {count} != holders"
