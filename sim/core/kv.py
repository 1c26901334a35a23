"""Paged KV-cache memory: fixed-size blocks, refcounts, a free queue, a null block.

The pool is vLLM v1's (vllm/v1/core/block_pool.py and kv_cache_manager.py, as
of the release docs/vllm_parity.md names), so that the continuous scheduler
makes vLLM's decisions; the parity suite (parity/) checks it step by step.

Block 0 is the null block: never handed out, it is where padding rows write.
Block tables are tuples, rebuilt only when a block is added (every
`block_size` tokens), so a step plan can hold them without copying.

Free blocks sit in one queue in eviction order (sim/core/free_queue.py): a
freed block without a name goes to its front and is reused first (LIFO), a
named one to its back, so reuse evicts the least recently freed name (LRU);
a request's table is freed tail first. A block returns to the queue only
when its refcount drops to zero.

Prefix caching (names: sim/core/prefix.py; index: sim/core/prefix_index.py):
a block is named when it is allocated for the step that fills it
(`cache_computed`), so a request admitted later in the same step hits it;
every full block is named, generated ones included, so a request preempted
by recompute resumes from its cached prompt and output. Two blocks may carry
the same name (two requests computed one prefix at once): hits take the
first, the next serves once the first is evicted. A block keeps its name when
freed, so a later request with the same prefix takes it back (a hit; a hit on
a free block takes it out of the middle of the queue). Taking a named block
for new content evicts its name. Without prefix caching no name exists,
every freed block goes to the front, and the paths are the plain ones.

Admission (`allocate`) keeps vLLM's watermark (int(watermark * num_blocks)
blocks left free while others run) and, when asked, its full-sequence check
(`scheduler_reserve_full_isl`: blocks for every known token must fit, not
just the first chunk's).

Swap preemption (servesim's; vLLM v1 has none) parks a request's blocks in a
host pool of `host_swap_blocks`; the GPU blocks are freed (named ones stay
cached) and fresh ones are taken when it swaps back in.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from sim.core.paged import NULL_BLOCK, PagedBlockManager
from sim.core.request import Request

__all__ = ["NULL_BLOCK", "KVBudget", "KVManager", "PagedBlockManager", "num_kv_blocks"]


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


class KVBudget(NamedTuple):
    """How the pool was sized, kept so reports can show every term.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

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
    it up front, as servers before paging did. `full_sequence_tokens` is vLLM's
    full-sequence admission check (the paged pool applies it; a contiguous
    reservation already covers it). `request` lets a prefix-caching pool reuse
    cached blocks (the return value counts their tokens); `cached_prefix_tokens`
    asks how many it would find without changing anything (0 without a cache).
    """

    num_blocks: int
    block_size: int
    watermark_blocks: int
    enable_prefix_cache: bool
    num_evictions: int
    num_hit_tokens: int

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
                 reserve_tokens: int | None = None, request: Request | None = None,
                 full_sequence_tokens: int | None = None) -> int: ...

    def cached_prefix_tokens(self, request: Request) -> int: ...

    def append_slots(self, request_id: int, num_tokens: int) -> tuple[int, ...] | None: ...

    def append_blocks(self, request_ids: list[int], num_blocks: int
                      ) -> list[tuple[int, ...]] | None: ...

    def free(self, request_id: int) -> None: ...

    def check_invariants(self) -> None: ...


