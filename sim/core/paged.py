"""PagedBlockManager: refcounted blocks, an LRU free queue, a prefix cache, a host swap pool.

See sim/core/kv.py's docstring for the design; this file is the mechanics.
"""

from __future__ import annotations

from sim.core.prefix import block_hashes
from sim.core.request import Request

NULL_BLOCK = 0


class PagedBlockManager:
    """Hands out KV blocks to requests; `num_blocks` counts the null block too.

    `host_swap_blocks`: blocks the host pool holds for swap preemption (0 = none).
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01,
                 enable_prefix_cache: bool = False, host_swap_blocks: int = 0) -> None:
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
        self.watermark_blocks = int(watermark * (num_blocks - 1))
        self.enable_prefix_cache = enable_prefix_cache
        self.host_swap_blocks = host_swap_blocks
        # the free queue is _free[_head:] minus stale entries, oldest freed first; the
        # consumed prefix is dropped once it outweighs the live part
        self._free: list[int] = list(range(1, num_blocks))
        self._head = 0
        self._stale = [0] * num_blocks  # per block: queue entries a prefix hit invalidated
        self._num_stale = 0
        self._refcounts = [0] * num_blocks
        self._tables: dict[int, tuple[int, ...]] = {}
        # prefix cache: name -> block, block -> name; per held request its chain of
        # names and how many leading table blocks are named already
        self._cached: dict[int, int] = {}
        self._block_hash: list[int | None] = [None] * num_blocks
        self._chains: dict[int, tuple[int, ...]] = {}
        self._named: dict[int, int] = {}
        self._memo: tuple[Request, tuple[int, ...]] | None = None  # last request's chain
        self._host: dict[int, int] = {}  # request -> blocks parked in the host pool
        self._host_used = 0
        self.num_evictions = 0
        self.num_hit_tokens = 0
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    # -- sizes ---------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) - self._head - self._num_stale

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - len(self._free) + self._head + self._num_stale

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a named prefix, in use or free."""
        return len(self._cached)

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
        return self._refcounts[block]

    def block_hash(self, block: int) -> int | None:
        return self._block_hash[block]

    # -- prefix cache --------------------------------------------------------
    def _chain(self, request: Request) -> tuple[int, ...]:
        memo = self._memo
        if memo is not None and memo[0] is request:
            return memo[1]
        chain = block_hashes(request, self.block_size)
        self._memo = (request, chain)
        return chain

    def _match(self, request: Request) -> list[int]:
        """Cached blocks of the request's longest cached prefix, at most prompt - 1 tokens."""
        chain, cached = self._chain(request), self._cached
        limit = min(len(chain), (request.prompt_tokens - 1) // self.block_size)
        blocks = []
        for i in range(limit):
            block = cached.get(chain[i])
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cached_prefix_tokens(self, request: Request) -> int:
        """Prompt tokens `request` would find cached now (whole blocks); changes nothing."""
        if not self.enable_prefix_cache:
            return 0
        return len(self._match(request)) * self.block_size

    def cache_computed(self, request_id: int, num_computed_tokens: int) -> None:
        """Name the request's prompt blocks that the tokens computed so far have filled.

        A name already cached (another request computed the same prefix at the same
        time) leaves this block unnamed: the first copy serves later hits.
        """
        chain = self._chains.get(request_id)
        if chain is None:
            return
        full = min(num_computed_tokens // self.block_size, len(chain))
        start = self._named[request_id]
        if full <= start:
            return
        table, cached, names = self._tables[request_id], self._cached, self._block_hash
        for i in range(start, full):
            name = chain[i]
            if name not in cached:
                cached[name] = table[i]
                names[table[i]] = name
        self._named[request_id] = full

    # -- operations ----------------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int, use_watermark: bool = True,
                 reserve_tokens: int | None = None, request: Request | None = None) -> int:
        """Give a new request blocks for `num_tokens`; returns tokens found in cache (or -1).

        -1 means not enough free blocks (above the watermark); nothing changes.
        With prefix caching and `request` given, the longest cached prefix (whole
        blocks, at most num_tokens - 1 and prompt - 1 tokens) is reused and its token
        count returned; otherwise 0. `reserve_tokens` is ignored: paging grows tables
        as tokens are written.
        """
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already holds blocks")
        reserve = self.watermark_blocks if use_watermark else 0
        if request is not None and self.enable_prefix_cache:
            return self._allocate_cached(request_id, num_tokens, reserve, request)
        needed = self.blocks_for(num_tokens)
        if len(self._free) - self._head - self._num_stale - needed < reserve:
            return -1
        self._tables[request_id] = self._take(needed)
        return 0

    def _allocate_cached(self, request_id: int, num_tokens: int, reserve: int,
                         request: Request) -> int:
        hits = self._match(request)[:max(0, (num_tokens - 1) // self.block_size)]
        refcounts = self._refcounts
        revived = sum(1 for b in hits if not refcounts[b])  # hits that leave the free queue
        needed = self.blocks_for(num_tokens) - len(hits)
        if self.num_free_blocks - revived - needed < reserve:
            return -1
        stale = self._stale
        for block in hits:
            if not refcounts[block]:
                stale[block] += 1
                self._num_stale += 1
            refcounts[block] += 1
        self._tables[request_id] = tuple(hits) + self._take(needed)
        self._chains[request_id] = self._chain(request)
        self._named[request_id] = len(hits)
        tokens = len(hits) * self.block_size
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
        if missing > len(self._free) - self._head - self._num_stale:
            return None
        table = self._tables[request_id] = table + self._take(missing)
        return table

    def append_block_each(self, request_ids: list[int]) -> list[tuple[int, ...]] | None:
        """Add one block to each request's table, in order; returns the new tables.

        Same blocks as calling append_slots one request at a time, in one call for the
        decodes that crossed a block boundary this step. None if the pool runs short,
        and then nothing changes (the caller goes one by one and preempts).
        """
        if len(request_ids) > len(self._free) - self._head - self._num_stale:
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
        Named blocks keep their names until taken for other content.
        """
        if self._chains:
            self._chains.pop(request_id, None)
            self._named.pop(request_id, None)
        refcounts = self._refcounts
        released = []
        for block in reversed(self._tables.pop(request_id, ())):
            refcounts[block] -= 1
            if not refcounts[block]:
                released.append(block)
        self._free.extend(released)

    def _take(self, count: int) -> tuple[int, ...]:
        head, free = self._head, self._free
        if self._num_stale:
            blocks, head = self._take_skipping(count, head)
        else:
            blocks = tuple(free[head:head + count])
            head += count
        refcounts = self._refcounts
        for block in blocks:
            refcounts[block] = 1
        if self._cached:  # names exist only with prefix caching
            self._evict(blocks)
        if head > 4096 and 2 * head > len(free):
            del free[:head]
            head = 0
        self._head = head
        return blocks

    def _take_skipping(self, count: int, head: int) -> tuple[tuple[int, ...], int]:
        """Pop `count` live entries from the head, dropping the stale ones met on the way."""
        free, stale = self._free, self._stale
        taken: list[int] = []
        while len(taken) < count:
            block = free[head]
            head += 1
            if stale[block]:
                stale[block] -= 1
                self._num_stale -= 1
            else:
                taken.append(block)
        return tuple(taken), head

    def _evict(self, blocks: tuple[int, ...]) -> None:
        """Drop the names of blocks taken for new content."""
        names, cached = self._block_hash, self._cached
        for block in blocks:
            name = names[block]
            if name is not None:
                del cached[name]
                names[block] = None
                self.num_evictions += 1

    # -- swap ----------------------------------------------------------------
    def swap_out(self, request_id: int) -> int:
        """Park the request's blocks in the host pool and free them here; returns the count.

        -1 when the host pool lacks room; then nothing changes.
        """
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

    def swap_in(self, request_id: int, num_tokens: int, use_watermark: bool = True) -> int:
        """Bring a swapped request back on fresh blocks covering `num_tokens`; returns blocks moved.

        -1 when the GPU pool lacks the blocks (above the watermark); nothing changes.
        """
        count = self._host[request_id]
        needed = max(self.blocks_for(num_tokens), count)
        reserve = self.watermark_blocks if use_watermark else 0
        if self.num_free_blocks - needed < reserve:
            return -1
        self._tables[request_id] = self._take(needed)
        del self._host[request_id]
        self._host_used -= count
        self.num_swapped_in_blocks += count
        return count

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is broken; for tests."""
        stale = list(self._stale)
        free_list = []
        for b in self._free[self._head:]:  # the queue as _take would pop it
            if stale[b]:
                stale[b] -= 1
            else:
                free_list.append(b)
        assert not any(stale), "a stale free-queue entry that no longer exists"
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
        for b, count in enumerate(self._refcounts):
            assert count >= 0, f"block {b} refcount {count} < 0"
            assert count == holders.get(b, 0), f"block {b} refcount {count} != its holders"
        names = self._block_hash
        assert all(names[b] == h for h, b in self._cached.items()), "name index out of sync"
        assert sum(n is not None for n in names) == len(self._cached), "stray block name"
        assert all(n == 1 or names[b] is not None for b, n in holders.items()), \
            "a block shared without a prefix-cache name"
        assert self._host_used == sum(self._host.values()) <= self.host_swap_blocks
        assert not self._host.keys() & self._tables.keys(), "a request both swapped and held"
