"""PagedBlockManager: refcounted blocks, vLLM's free queue, a prefix cache, a host swap pool.

See sim/core/kv.py's docstring for the design; this file is the mechanics.
"""

from __future__ import annotations

from operator import add

from sim.core.free_queue import FreeQueue
from sim.core.offload_tier import TierStack
from sim.core.prefix_index import PrefixIndex
from sim.core.request import Request

NULL_BLOCK = 0


class PagedBlockManager:
    """Hands out KV blocks to requests; `num_blocks` counts the null block too.

    `watermark`: vLLM's `SchedulerConfig.watermark`, the share of the pool
    (null block included) an admission must leave free while others run.
    `host_swap_blocks`: blocks the host pool holds for swap preemption (0 = none).
    `block_shard_bytes`: one GPU's shard of a block, what a swapped or offload-loaded
    block puts on its link (as a KVTransfer, sim.core.kv_transfer, that the world sends).
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0,
                 enable_prefix_cache: bool = False, host_swap_blocks: int = 0,
                 offload_blocks: int = 0, offload_disk_blocks: int = 0,
                 block_shard_bytes: float = 0.0, offload_async: bool = False) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is the null block), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        if host_swap_blocks < 0:
            raise ValueError(f"host_swap_blocks must be >= 0, got {host_swap_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.enable_prefix_cache = enable_prefix_cache
        self.host_swap_blocks = host_swap_blocks
        self.block_shard_bytes = block_shard_bytes
        self._queue = FreeQueue(num_blocks)
        # holders per block; only a prefix cache shares blocks, so without one a block is
        # held by at most one table and the count (0 or 1) is left to the tables: taking
        # and freeing whole tables then costs a slice, not a loop over their blocks
        self._refcounts: list[int] | None = [0] * num_blocks if enable_prefix_cache else None
        self._tables: dict[int, tuple[int, ...]] = {}
        self._prefix = PrefixIndex(block_size)
        self._host: dict[int, int] = {}  # request -> blocks parked in the host pool
        self._host_used = 0
        self.num_evictions = 0
        self.num_hit_tokens = 0
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0
        # the offload tiers under the prefix cache, host then disk (sim/core/offload_tier.py),
        # each loaded block puts `block_shard_bytes` on its tier's link; None: no tier
        self.offload: TierStack | None = None
        if offload_blocks and enable_prefix_cache:
            sizes = (offload_blocks, offload_disk_blocks) if offload_disk_blocks else (
                offload_blocks,)
            self.offload = TierStack(sizes, block_shard_bytes, offload_async)
        self.loaded_tokens = 0  # tokens the last allocate() loaded from the offload tier

    # -- sizes ---------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - 1 - len(self._queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a name, in use or free."""
        return self._prefix.num_named_blocks

    @property
    def num_host_blocks_used(self) -> int:
        return self._host_used

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

    def refcount(self, block: int) -> int:
        if self._refcounts is None:
            return sum(block in table for table in self._tables.values())
        return self._refcounts[block]

    def block_hash(self, block: int) -> int | None:
        return self._prefix.names.get(block)

    # -- prefix cache --------------------------------------------------------
    def cached_prefix_tokens(self, request: Request) -> int:
        """Tokens `request` would find cached now (whole blocks, prompt and output; with an
        offload tier, the blocks it would load back after the GPU's)."""
        cached = len(self._prefix.match(request)) if self.enable_prefix_cache else 0
        if self.offload is not None:
            limit = (request.num_known_tokens - 1) // self.block_size
            cached += self.offload.run_length(self._prefix.names_between(request, cached, limit))
        return cached * self.block_size

    def cache_computed(self, request_id: int, num_tokens: int) -> None:
        """Name the request's blocks that its first `num_tokens` tokens fill.

        vLLM names a block when it is allocated for the step that fills it, so a
        request admitted later in the same step already hits it.
        """
        table = self._tables.get(request_id)
        if table is not None and self.enable_prefix_cache:  # names exist only with the cache
            self._prefix.name(request_id, table, num_tokens)

    # -- operations ----------------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int, use_watermark: bool = True,
                 reserve_tokens: int | None = None, request: Request | None = None,
                 full_sequence_tokens: int | None = None) -> int:
        """Give a new request blocks for `num_tokens`; returns tokens found in cache (or -1).

        -1 means not enough free blocks (above the watermark); nothing changes.
        With prefix caching and `request` given, the longest cached prefix (whole
        blocks, at most num_tokens - 1 and known - 1 tokens) is reused and its token
        count returned; otherwise 0. `full_sequence_tokens` (vLLM's
        `scheduler_reserve_full_isl`): refuse unless blocks for that many tokens,
        hits counted, fit as well. `reserve_tokens` is ignored: paging grows tables
        as tokens are written.
        """
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already holds blocks")
        reserve = self.watermark_blocks if use_watermark else 0
        hits: list[int] = []
        if request is not None and self.enable_prefix_cache:
            hits = self._prefix.match(request)[:max(0, (num_tokens - 1) // self.block_size)]
        loads: list[int] = []  # names the offload tier gives back, after the GPU's hits
        if self.offload is not None and request is not None:
            limit = max(0, (num_tokens - 1) // self.block_size)
            names = self._prefix.names_between(request, len(hits), limit)
            loads = names[:self.offload.run_length(names)]
        refcounts = self._refcounts
        revived = 0  # hits that leave the free queue
        if hits:
            assert refcounts is not None
            revived = sum(1 for b in hits if not refcounts[b])
        free = self.num_free_blocks - revived - reserve
        if full_sequence_tokens is not None and \
                self.blocks_for(full_sequence_tokens) - len(hits) > free:
            return -1
        needed = self.blocks_for(num_tokens) - len(hits)
        if needed > free:
            return -1
        if self.offload is not None:  # before _take: the loaded names are the freshest
            self.offload.load(loads)
            self.loaded_tokens = len(loads) * self.block_size
        for block in hits:
            assert refcounts is not None
            if not refcounts[block]:
                self._queue.remove(block)
            refcounts[block] += 1
        self._tables[request_id] = tuple(hits) + self._take(needed)
        if request is not None and self.enable_prefix_cache:
            self._prefix.hold(request_id, request, len(hits))
        tokens = (len(hits) + len(loads)) * self.block_size
        self.num_hit_tokens += tokens
        return tokens

    def append_slots(self, request_id: int, num_tokens: int) -> tuple[int, ...] | None:
        """Grow the request's table to cover `num_tokens`; returns it, or None if blocks ran out.

        Called for every running sequence every step, so the common case (the last
        block still has room) is one dict lookup and a comparison.
        """
        table = self._tables[request_id]
        missing = -(-num_tokens // self.block_size) - len(table)
        if missing <= 0:
            return table
        if missing > self.num_free_blocks:
            return None
        table = self._tables[request_id] = table + self._take(missing)
        return table

    def append_blocks(self, request_ids: list[int], num_blocks: int
                      ) -> list[tuple[int, ...]] | None:
        """Deal `num_blocks` new blocks to the requests' tables in turn; returns the new tables.

        Of n = len(request_ids) distinct requests (0 < n <= num_blocks, or both 0), request
        i gets blocks i, i + n, i + 2n, ... of those taken: what append_slots gives when
        asked for one block for each request in order, round after round, as the decodes
        of n sequences over a row of steps ask (one step's: num_blocks = n). One call and
        one slice per table whatever the rounds. None if the pool runs short, and then
        nothing changes (the caller goes one by one and preempts).
        """
        if num_blocks > len(self._queue):  # num_free_blocks, one call less: every step
            return None
        n = len(request_ids)
        assert 0 < n <= num_blocks or n == num_blocks == 0, "blocks dealt to no request"
        taken = self._take(num_blocks)
        tables = self._tables
        dealt = zip(taken) if num_blocks == n else [taken[i::n] for i in range(n)]
        grown = list(map(add, map(tables.__getitem__, request_ids), dealt))
        tables.update(zip(request_ids, grown, strict=True))
        return grown

    def free(self, request_id: int) -> None:
        """Return a request's blocks, the table's tail first (vLLM's BlockPool.free_blocks).

        A block without a name goes to the front of the queue, reused first (LIFO);
        a named one to the back (LRU), keeping its name until taken for other content.
        """
        if self._host:  # an aborted swapped-out request
            self._host_used -= self._host.pop(request_id, 0)
        table = self._tables.pop(request_id, ())
        refcounts = self._refcounts
        if refcounts is None:  # no prefix cache: no names, every block its table's alone
            self._queue.push_front(table)
            return
        self._prefix.release(request_id)
        hashes = self._prefix.names
        for block in table:
            refcounts[block] -= 1
        released = [block for block in table if not refcounts[block]]  # head first
        if not hashes:  # no names: every block to the front, the tail taken first
            self._queue.push_front(released)
            return
        self._queue.push_front([block for block in released if block not in hashes])
        self._queue.push_back([block for block in reversed(released) if block in hashes])

    def _take(self, count: int) -> tuple[int, ...]:
        front, back = self._queue.pop(count)
        refcounts = self._refcounts
        if refcounts is None:
            return front + back if back else front
        for block in front:
            refcounts[block] = 1
        if not back:
            return front
        for block in back:
            refcounts[block] = 1
        if self._prefix.names:  # names exist only with prefix caching, and only at the back
            if self.offload is not None:  # evicted names go down a tier instead of vanishing
                names = self._prefix.names
                self.offload.spill([names[b] for b in back if b in names])
            self.num_evictions += self._prefix.evict(back)
        return front + back

    # -- swap ----------------------------------------------------------------
    def swap_out(self, request_id: int) -> int:
        """Park the request's blocks in the host pool and free them here; returns the count
        (-1 when the host pool lacks room; then nothing changes)."""
        count = len(self._tables.get(request_id, ()))
        if self._host_used + count > self.host_swap_blocks:
            return -1
        self.free(request_id)
        self._host[request_id] = count
        self._host_used += count
        self.num_swapped_out_blocks += count
        return count

    def is_swapped(self, request_id: int) -> bool:
        return request_id in self._host

    def swap_in(self, request_id: int, num_tokens: int, use_watermark: bool = True,
                request: Request | None = None, full_sequence_tokens: int | None = None
                ) -> int:
        """Bring a swapped request back on fresh blocks covering `num_tokens`; returns blocks moved.

        -1 when the GPU pool lacks the blocks (above the watermark, and for
        `full_sequence_tokens` as in allocate); nothing changes. With `request` and
        prefix caching its blocks can be named again (cache_computed).
        """
        count = self._host[request_id]
        needed = max(self.blocks_for(num_tokens), count)
        free = self.num_free_blocks - (self.watermark_blocks if use_watermark else 0)
        if full_sequence_tokens is not None and self.blocks_for(full_sequence_tokens) > free:
            return -1
        if needed > free:
            return -1
        self._tables[request_id] = self._take(needed)
        if request is not None and self.enable_prefix_cache:
            self._prefix.hold(request_id, request, 0)
        del self._host[request_id]
        self._host_used -= count
        self.num_swapped_in_blocks += count
        return count

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is broken; for tests."""
        front, back = self._queue.blocks()
        names = self._prefix.names
        assert not any(b in names for b in front), "a named block up front"
        free_list = front + back
        free = set(free_list)
        assert len(free) == len(free_list), "a block is queued as free twice"
        assert len(free_list) == self.num_free_blocks, "free count out of sync"
        holders: dict[int, int] = {}
        for table in self._tables.values():
            for b in table:
                holders[b] = holders.get(b, 0) + 1
        assert NULL_BLOCK not in holders and NULL_BLOCK not in free, "null block handed out"
        assert len(holders) + len(free) == self.num_usable_blocks, "free + used != total"
        assert not holders.keys() & free, "a block is both free and used"
        assert all(1 <= b < self.num_blocks for b in free), "free block id out of range"
        for b, count in enumerate(self._refcounts or ()):
            assert count >= 0, f"block {b} refcount {count} < 0"
            assert count == holders.get(b, 0), f"block {b} refcount {count} != its holders"
        self._prefix.check()
        assert all(n == 1 or b in names for b, n in holders.items()), \
            "a block shared without a prefix-cache name"
        assert self._host_used == sum(self._host.values()) <= self.host_swap_blocks
        assert not self._host.keys() & self._tables.keys(), "a request both swapped and held"
        if self.offload is not None:
            self.offload.check()
