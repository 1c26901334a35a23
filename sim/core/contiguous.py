"""Contiguous KV memory: each request reserves its peak up front, as servers before paging did.

Why it exists: to measure what paging buys. The pool is the paged pool's
address space (the same `num_blocks`, block 0 the null block, the same budget),
but a request takes one consecutive run of blocks big enough for its whole
reservation (prompt + maximum output) at admission and keeps it until it
leaves. Allocation is first-fit over the holes in address order, so external
fragmentation is real: free blocks split across holes can leave a request
waiting that the free count alone says would fit (`largest_free_run` shows it).

A request's block table is the prefix of its run that covers the tokens
written so far, so plans look like the paged pool's (one more block every
`block_size` tokens) and the continuous scheduler runs on either pool
unchanged. The rest of the run is reserved but holds no token: the waste.
"""

from __future__ import annotations

from bisect import bisect_left

from sim.core.kv import NULL_BLOCK
from sim.core.request import Request


class ContiguousAllocator:
    """First-fit reservations of consecutive blocks; the same calls as PagedBlockManager."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is the null block), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)  # as the paged pool
        # holes: start -> length, with their starts sorted; never two adjacent holes
        self._hole_starts: list[int] = [1]
        self._hole_len: dict[int, int] = {1: num_blocks - 1}
        self._num_free = num_blocks - 1
        self._runs: dict[int, tuple[int, int]] = {}  # request -> (first block, blocks reserved)
        self._tables: dict[int, tuple[int, ...]] = {}
        # no prefix cache here: the counters exist so callers treat both pools alike
        self.enable_prefix_cache = False
        self.num_evictions = 0
        self.num_hit_tokens = 0

    # -- sizes ---------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_used_blocks(self) -> int:
        """Blocks reserved, whether or not they hold a token yet."""
        return self.num_usable_blocks - self._num_free

    @property
    def largest_free_run(self) -> int:
        """The biggest reservation that fits now, in blocks (< free blocks when fragmented)."""
        return max(self._hole_len.values(), default=0)

    @property
    def num_holes(self) -> int:
        return len(self._hole_starts)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def peak_tokens(self, max_kv_tokens: int, reserve_tokens: int | None) -> int:
        """Token slots a request holds at its peak: its whole reservation."""
        return max_kv_tokens if reserve_tokens is None else max(max_kv_tokens, reserve_tokens)

    def block_table(self, request_id: int) -> tuple[int, ...]:
        return self._tables.get(request_id, ())

    def num_slots(self, request_id: int) -> int:
        """Token slots the request's table covers (written or being written)."""
        return len(self._tables.get(request_id, ())) * self.block_size

    def reserved_slots(self, request_id: int) -> int:
        """Token slots the request's reservation holds."""
        run = self._runs.get(request_id)
        return 0 if run is None else run[1] * self.block_size

    # -- operations ----------------------------------------------------------
    def cached_prefix_tokens(self, request: Request) -> int:
        """Always 0: a contiguous pool has no prefix cache."""
        return 0

    def allocate(self, request_id: int, num_tokens: int, use_watermark: bool = True,
                 reserve_tokens: int | None = None, request: Request | None = None,
                 full_sequence_tokens: int | None = None) -> int:
        """Reserve one run for max(num_tokens, reserve_tokens); the table covers num_tokens.

        Returns 0 (no prefix cache), or -1 when no hole is big enough or the free
        blocks left would dip under the watermark; then nothing changes. The
        reservation (prompt + maximum output) always holds `full_sequence_tokens`.
        """
        if request_id in self._runs:
            raise ValueError(f"request {request_id} already holds blocks")
        shown = self.blocks_for(num_tokens)
        needed = max(shown, self.blocks_for(reserve_tokens or 0))
        reserve = self.watermark_blocks if use_watermark else 0
        if self._num_free - needed < reserve:
            return -1
        start = self._first_fit(needed)
        if start is None:
            return -1
        self._runs[request_id] = (start, needed)
        self._tables[request_id] = tuple(range(start, start + shown))
        return 0

    def _first_fit(self, needed: int) -> int | None:
        """Carve `needed` blocks from the front of the lowest-addressed hole that holds them."""
        starts, lengths = self._hole_starts, self._hole_len
        for i, start in enumerate(starts):
            length = lengths[start]
            if length < needed:
                continue
            del lengths[start]
            if length == needed:
                del starts[i]
            else:
                starts[i] = start + needed
                lengths[start + needed] = length - needed
            self._num_free -= needed
            return start
        return None

    def append_slots(self, request_id: int, num_tokens: int) -> tuple[int, ...] | None:
        """Extend the table within the reservation; None past it (a run never grows)."""
        table = self._tables[request_id]
        blocks = -(-num_tokens // self.block_size)
        if blocks <= len(table):
            return table
        start, reserved = self._runs[request_id]
        if blocks > reserved:
            return None
        table = self._tables[request_id] = tuple(range(start, start + blocks))
        return table

    def append_blocks(self, request_ids: list[int], num_blocks: int
                      ) -> list[tuple[int, ...]] | None:
        """Show more reserved blocks in each table, dealt as the paged pool deals them (request
        i of n gets num_blocks // n, one more if i < num_blocks % n); None (no change) if
        one's reservation has too few left."""
        runs, tables = self._runs, self._tables
        rounds, rest = divmod(num_blocks, len(request_ids)) if request_ids else (0, 0)
        shown = [len(tables[rid]) + rounds + (i < rest) for i, rid in enumerate(request_ids)]
        if any(blocks > runs[rid][1] for rid, blocks in zip(request_ids, shown, strict=True)):
            return None
        grown = []
        for rid, blocks in zip(request_ids, shown, strict=True):
            start = runs[rid][0]
            table = tables[rid] = tuple(range(start, start + blocks))
            grown.append(table)
        return grown

    def free(self, request_id: int) -> None:
        """Return the run as a hole, merged with the holes on either side."""
        run = self._runs.pop(request_id, None)
        self._tables.pop(request_id, None)
        if run is None:
            return
        start, length = run
        starts, lengths = self._hole_starts, self._hole_len
        i = bisect_left(starts, start)
        if i < len(starts) and starts[i] == start + length:  # merge with the next hole
            length += lengths.pop(starts.pop(i))
        if i > 0 and starts[i - 1] + lengths[starts[i - 1]] == start:  # ... and the previous
            lengths[starts[i - 1]] += length
        else:
            starts.insert(i, start)
            lengths[start] = length
        self._num_free += run[1]

    def check_invariants(self) -> None:
        """Raise AssertionError if the accounting is broken; for tests."""
        starts, lengths = self._hole_starts, self._hole_len
        assert starts == sorted(lengths), "hole index out of sync"
        spans = sorted([(s, lengths[s]) for s in starts] + list(self._runs.values()))
        position = NULL_BLOCK + 1
        for start, length in spans:
            assert length >= 1, f"empty span at {start}"
            assert start == position, f"gap or overlap at block {position} (next span {start})"
            position = start + length
        assert position == self.num_blocks, "spans do not end at the pool's end"
        for a, b in zip(starts, starts[1:], strict=False):
            assert a + lengths[a] < b, f"adjacent holes at {a} and {b} were not merged"
        assert self._num_free == sum(lengths.values()), "free count out of sync"
        assert self._num_free + sum(n for _, n in self._runs.values()) == self.num_usable_blocks
        assert self._tables.keys() == self._runs.keys(), "table without a run or run without one"
        for rid, (start, reserved) in self._runs.items():
            table = self._tables[rid]
            assert table == tuple(range(start, start + len(table))), f"{rid}: table not a prefix"
            assert len(table) <= reserved, f"request {rid}'s table outgrew its reservation"
