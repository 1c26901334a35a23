"""Oracles: the continuous scheduler and block manager before vectorisation, verbatim.

Kept only for tests, which drive them and the production classes with the same
workloads and assert plan-for-plan (and block-id for block-id) equality.
Do not optimise them.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from sim.core.kv import NULL_BLOCK
from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request, RequestState


class ReferenceContinuousScheduler:
    def __init__(self, kv: ReferencePagedBlockManager, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, chunked_prefill: bool = True,
                 max_model_len: int | None = None) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs}) so every decode fits a step")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is the next victim
        self._in_flight: dict[int, Request] = {}

    # -- queries -------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.num_used_blocks

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def next_wakeup(self, now: float) -> float | None:
        return None

    # -- contract ------------------------------------------------------------
    def add(self, request: Request, now: float) -> bool:
        reason = self._never_fits(request)
        if reason is not None:
            request.reject(reason, now)
            return False
        self.waiting.append(request)
        self._in_flight[request.request_id] = request
        return True

    def _never_fits(self, request: Request) -> str | None:
        total = request.prompt_tokens + request.output_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            return f"prompt+output {total} > max_model_len {self.max_model_len}"
        if self.kv.blocks_for(request.max_kv_tokens) > self.kv.num_usable_blocks:
            return (f"needs {request.max_kv_tokens} KV tokens, pool holds "
                    f"{self.kv.num_usable_blocks * self.kv.block_size}")
        if not self.chunked_prefill and request.prompt_tokens > self.max_num_batched_tokens:
            return (f"prompt {request.prompt_tokens} > max_num_batched_tokens "
                    f"{self.max_num_batched_tokens} with chunked prefill off")
        return None

    def schedule(self, now: float) -> StepPlan | None:
        kv, running = self.kv, self.running
        budget = self.max_num_batched_tokens
        step = _PlanBuilder()
        preempted: list[int] = []

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            new = min(req.prompt_tokens + req.num_output_done - computed, budget)
            table = kv.append_slots(req.request_id, computed + new)
            while table is None:
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
                table = kv.append_slots(req.request_id, computed + new)
            if table is None:
                break  # the request preempted itself: everyone after it is gone too
            step.add(req, new, table)
            budget -= new
            i += 1

        if not preempted:
            self._admit(budget, step, now)
        if not step.request_ids:
            return None
        return step.build(tuple(preempted))

    def _admit(self, budget: int, step: _PlanBuilder, now: float) -> None:
        kv, waiting, running = self.kv, self.waiting, self.running
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting[0]
            new = req.num_known_tokens - req.num_computed_tokens
            if new > budget:
                # without chunking a prefill waits for a step with room, unless it can
                # never have room (a recompute longer than the whole budget): chunk it
                if not self.chunked_prefill and new <= self.max_num_batched_tokens:
                    break
                new = budget
            if kv.allocate(req.request_id, req.num_computed_tokens + new,
                           use_watermark=bool(running)) < 0:
                break
            waiting.popleft()
            running.append(req)
            req.state = RequestState.RUNNING
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
            step.add(req, new, kv.block_table(req.request_id))
            budget -= new

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)

    def on_step_done(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        in_flight = self._in_flight
        finished: list[Request] = []
        for rid, new, emits in zip(plan.request_ids, plan.num_new_tokens, plan.emits_token,
                                   strict=True):
            req = in_flight[rid]
            req.num_computed_tokens += new
            if not emits:
                continue
            req.num_output_done += 1
            if req.first_token_s is None:
                req.first_token_s = now
            if req.num_output_done == req.output_tokens:
                req.state = RequestState.FINISHED
                req.finish_s = now
                self.kv.free(rid)
                del in_flight[rid]
                finished.append(req)
        if finished:
            self.running = [r for r in self.running if r.state is RequestState.RUNNING]
        return finished


class _PlanBuilder:
    """Accumulates a step's columns and its shape in one pass over the batch."""

    __slots__ = ("request_ids", "num_new", "contexts", "tables", "prefills", "emits",
                 "chunk_tokens", "chunk_contexts", "num_decodes", "decode_sum", "decode_max")

    def __init__(self) -> None:
        self.request_ids: list[int] = []
        self.num_new: list[int] = []
        self.contexts: list[int] = []
        self.tables: list[tuple[int, ...]] = []
        self.prefills: list[bool] = []
        self.emits: list[bool] = []
        self.chunk_tokens: list[int] = []
        self.chunk_contexts: list[int] = []
        self.num_decodes = self.decode_sum = self.decode_max = 0

    def add(self, req: Request, new: int, table: tuple[int, ...]) -> None:
        computed = req.num_computed_tokens
        known = req.prompt_tokens + req.num_output_done
        is_decode = new == 1 and computed == known - 1 and req.num_output_done > 0
        self.request_ids.append(req.request_id)
        self.num_new.append(new)
        self.contexts.append(computed)
        self.tables.append(table)
        self.prefills.append(not is_decode)
        self.emits.append(computed + new == known)
        if is_decode:
            self.num_decodes += 1
            self.decode_sum += computed
            if computed > self.decode_max:
                self.decode_max = computed
        else:
            self.chunk_tokens.append(new)
            self.chunk_contexts.append(computed)

    def build(self, preempted: tuple[int, ...]) -> StepPlan:
        shape = StepShape(tuple(self.chunk_tokens), tuple(self.chunk_contexts), self.num_decodes,
                          self.decode_sum, self.decode_max, len(self.request_ids))
        return StepPlan(tuple(self.request_ids), tuple(self.num_new), tuple(self.contexts),
                        tuple(self.tables), tuple(self.prefills), tuple(self.emits), shape,
                        preempted)


class ReferencePagedBlockManager:
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

    def append_slots(self, request_id: int, num_tokens: int) -> tuple[int, ...] | None:
        """Grow the request's table to cover `num_tokens`; returns it, or None if blocks ran out.

        Called for every running sequence every step, so the common case (the last
        block still has room) is one dict lookup and a comparison.
        """
        table = self._tables[request_id]
        missing = -(-num_tokens // self.block_size) - len(table)
        if missing <= 0:
            return table
        if missing > len(self._free):
            return None
        table = self._tables[request_id] = table + self._take(missing)
        return table

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
