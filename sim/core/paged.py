"""PagedBlockManager: refcounted blocks, vLLM's free queue, a prefix cache, a host swap pool.

See sim/core/kv.py's docstring for the design; this file is the mechanics.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

from sim.core.prefix import block_hashes, own_names_base
from sim.core.request import Request

NULL_BLOCK = 0


def _is_name(name: int | None) -> bool:
    return name is not None


class PagedBlockManager:
    """Hands out KV blocks to requests; `num_blocks` counts the null block too.

    `watermark`: vLLM's `SchedulerConfig.watermark`, the share of the pool
    (null block included) an admission must leave free while others run.
    `host_swap_blocks`: blocks the host pool holds for swap preemption (0 = none).
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0,
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
        self.watermark_blocks = int(watermark * num_blocks)
        self.enable_prefix_cache = enable_prefix_cache
        self.host_swap_blocks = host_swap_blocks
        # the free queue, front to back: _front reversed (freed blocks without a name,
        # last freed first), then _free[_head:] minus stale entries (named blocks in the
        # order freed, after the never-used ones); the FIFO's consumed prefix is dropped
        # once it outweighs the live part
        self._front: list[int] = []
        self._free: list[int] = list(range(1, num_blocks))
        self._head = 0
        self._stale = [0] * num_blocks  # per block: FIFO entries a prefix hit invalidated
        self._num_stale = 0
        self._refcounts = [0] * num_blocks
        self._tables: dict[int, tuple[int, ...]] = {}
        # prefix cache: name -> the block hits get (the first named), later blocks with
        # the same name in naming order, block -> name (named blocks only); per held
        # request its prompt's content names (own names follow) and how many leading
        # table blocks carry their names. Dicts, so a prefill's blocks are named in bulk.
        self._cached: dict[int, int] = {}
        self._copies: dict[int, list[int]] = {}
        self._block_hash: dict[int, int] = {}
        self._chains: dict[int, tuple[int, ...]] = {}
        self._named: dict[int, int] = {}
        self._memo: tuple[Request, tuple[int, ...]] | None = None  # last request's prompt names
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
        return len(self._front) + len(self._free) - self._head - self._num_stale

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a name, in use or free."""
        return len(self._cached) + sum(len(c) for c in self._copies.values())

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
        return self._block_hash.get(block)

    # -- prefix cache --------------------------------------------------------
    def _prompt_names(self, request: Request) -> tuple[int, ...]:
        memo = self._memo
        if memo is not None and memo[0] is request:
            return memo[1]
        chain = block_hashes(request, self.block_size)
        self._memo = (request, chain)
        return chain

    def _match(self, request: Request) -> list[int]:
        """Cached blocks of the longest cached prefix of prompt + output, up to known - 1 tokens.

        Past the described prompt, names are the request's own (a resumed request
        finds its own blocks); they are made only as far as the hits go.
        """
        chain, cached = self._prompt_names(request), self._cached
        limit = (request.num_known_tokens - 1) // self.block_size
        own, described = own_names_base(request.request_id), len(chain)
        blocks: list[int] = []
        for i in range(limit):
            block = cached.get(chain[i] if i < described else own - i)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cached_prefix_tokens(self, request: Request) -> int:
        """Tokens `request` would find cached now (whole blocks); changes nothing."""
        if not self.enable_prefix_cache:
            return 0
        return len(self._match(request)) * self.block_size

    def cache_computed(self, request_id: int, num_tokens: int) -> None:
        """Name the request's blocks that its first `num_tokens` tokens fill.

        vLLM names a block when it is allocated for the step that fills it, so a
        request admitted later in the same step already hits it. A name another
        block carries already (two requests computed the same content at once) is
        given to this block too: hits take the first, the others serve once it goes.
        """
        chain = self._chains.get(request_id)
        if chain is None:
            return
        full = num_tokens // self.block_size
        start = self._named[request_id]
        if full <= start:
            return
        self._named[request_id] = full
        cached = self._cached
        if full == start + 1:  # a decode filled its block: most calls
            name = chain[start] if start < len(chain) else own_names_base(request_id) - start
            block = self._tables[request_id][start]
            if name in cached:
                self._copies.setdefault(name, []).append(block)
            else:
                cached[name] = block
            self._block_hash[block] = name
            return
        names = list(chain[start:full])
        if full > len(chain):
            own = own_names_base(request_id)
            names += range(own - max(start, len(chain)), own - full, -1)
        blocks = self._tables[request_id][start:full]
        if cached.keys().isdisjoint(names):  # the common case: no content computed twice
            cached.update(zip(names, blocks, strict=True))
        else:
            for name, block in zip(names, blocks, strict=True):
                if name in cached:
                    self._copies.setdefault(name, []).append(block)
                else:
                    cached[name] = block
        self._block_hash.update(zip(blocks, names, strict=True))

    def _hold_names(self, request_id: int, request: Request | None, num_named: int) -> None:
        if request is not None and self.enable_prefix_cache:
            self._chains[request_id] = self._prompt_names(request)
            self._named[request_id] = num_named

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
            hits = self._match(request)[:max(0, (num_tokens - 1) // self.block_size)]
        refcounts = self._refcounts
        revived = sum(1 for b in hits if not refcounts[b])  # hits that leave the free queue
        free = self.num_free_blocks - revived - reserve
        if full_sequence_tokens is not None and \
                self.blocks_for(full_sequence_tokens) - len(hits) > free:
            return -1
        needed = self.blocks_for(num_tokens) - len(hits)
        if needed > free:
            return -1
        stale = self._stale
        for block in hits:
            if not refcounts[block]:
                stale[block] += 1
                self._num_stale += 1
            refcounts[block] += 1
        self._tables[request_id] = tuple(hits) + self._take(needed)
        self._hold_names(request_id, request, len(hits))
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
        if missing > self.num_free_blocks:
            return None
        table = self._tables[request_id] = table + self._take(missing)
        return table

    def append_block_each(self, request_ids: list[int]) -> list[tuple[int, ...]] | None:
        """Add one block to each request's table, in order; returns the new tables.

        Same blocks as calling append_slots one request at a time, in one call for the
        decodes that crossed a block boundary this step. None if the pool runs short,
        and then nothing changes (the caller goes one by one and preempts).
        """
        if len(request_ids) > self.num_free_blocks:
            return None
        tables = self._tables
        grown = []
        for request_id, block in zip(request_ids, self._take(len(request_ids)), strict=True):
            table = tables[request_id] = tables[request_id] + (block,)
            grown.append(table)
        return grown

    def free(self, request_id: int) -> None:
        """Return a request's blocks, the table's tail first (vLLM's BlockPool.free_blocks).

        A block without a name goes to the front of the queue, reused first (LIFO);
        a named one to the back (LRU), keeping its name until taken for other content.
        """
        if self._chains:
            self._chains.pop(request_id, None)
            self._named.pop(request_id, None)
        refcounts, hashes = self._refcounts, self._block_hash
        table = self._tables.pop(request_id, ())
        for block in table:
            refcounts[block] -= 1
        released = [block for block in table if not refcounts[block]]  # head first
        if not hashes:  # no names: every block to the front
            self._front += released  # _front's end is the queue's front: the tail goes first
            return
        self._front += [block for block in released if block not in hashes]
        self._free += [block for block in reversed(released) if block in hashes]

    def _take(self, count: int) -> tuple[int, ...]:
        front, taken = self._front, ()
        if front and count:
            n = min(count, len(front))
            taken = tuple(reversed(front[-n:]))
            del front[-n:]
            count -= n
            if not count:
                for block in taken:
                    self._refcounts[block] = 1
                return taken
        head, free = self._head, self._free
        if self._num_stale:
            blocks, head = self._take_skipping(count, head)
        else:
            blocks = tuple(free[head:head + count])
            head += count
        refcounts = self._refcounts
        for block in taken + blocks:
            refcounts[block] = 1
        if self._cached:  # names exist only with prefix caching; _front holds none
            self._evict(blocks)
        if head > 4096 and 2 * head > len(free):
            del free[:head]
            head = 0
        self._head = head
        return taken + blocks

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
        """Drop the names of blocks taken for new content; a later copy takes over a name."""
        names = list(map(self._block_hash.pop, blocks, repeat(None, len(blocks))))
        unnamed = names.count(None)
        if unnamed == len(names):
            return
        self.num_evictions += len(names) - unnamed
        cached, copies = self._cached, self._copies
        if not copies:  # every name is on one block: the one taken
            deque(map(cached.__delitem__, filter(_is_name, names) if unnamed else names), 0)
            return
        for block, name in zip(blocks, names, strict=True):
            if name is None:
                continue
            later = copies.get(name)
            if cached[name] == block:
                if later:
                    cached[name] = later.pop(0)
                else:
                    del cached[name]
            else:
                assert later is not None
                later.remove(block)
            if later is not None and not later:
                del copies[name]

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
        self._hold_names(request_id, request, 0)
        del self._host[request_id]
        self._host_used -= count
        self.num_swapped_in_blocks += count
        return count

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is broken; for tests."""
        stale = list(self._stale)
        free_list = self._front[::-1]  # the queue as _take would pop it
        names = self._block_hash
        assert not any(b in names for b in free_list), "a named block up front"
        for b in self._free[self._head:]:
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
        assert all(names.get(b) == h for h, b in self._cached.items()), "name index out of sync"
        assert all(h in self._cached and later and all(names.get(b) == h for b in later)
                   for h, later in self._copies.items()), "copy index out of sync"
        assert len(names) == self.num_cached_blocks, "stray block name"
        assert all(n == 1 or b in names for b, n in holders.items()), \
            "a block shared without a prefix-cache name"
        assert self._host_used == sum(self._host.values()) <= self.host_swap_blocks
        assert not self._host.keys() & self._tables.keys(), "a request both swapped and held"
