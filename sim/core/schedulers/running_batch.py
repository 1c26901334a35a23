"""The continuous scheduler's running set as a struct of numpy arrays.

Why: at batch sizes in the hundreds, per-sequence Python work in schedule() and
on_step_done() dominated the simulator (~2.7 us per sequence per step). Here a
step is a fixed number of numpy operations whatever the batch size; Python
touches only the sequences that need a new KV block (about one in block_size),
emit their first token, finish, are preempted or are newly admitted.

While a request is in the batch its `num_computed_tokens` and `num_output_done`
live here and the Request's own copies are stale; `sync()` writes them back,
and every request is synced as it leaves (finished or preempted).

After every applied step a running table holds exactly ceil(computed / block
size) blocks (blocks are only ever added to cover the tokens a step computes),
so a plain decode needs a block exactly when computed is a multiple of it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.core.decode_run import DecodeRun
from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers.plan_builder import PlanBuilder

# rows of RunningBatch.state
COMPUTED, KNOWN, DONE, TARGET = range(4)


class RunningBatch:
    """Per-sequence counters in one (4, capacity) int64 array, aligned with Python lists."""

    __slots__ = ("reqs", "rids", "tables", "state", "block_size", "pending", "_count", "_new",
                 "_emits", "_first_rows", "_admitted", "_covers_all", "_all_decode",
                 "_run_rows")

    def __init__(self, running: list[Request], kv: KVManager) -> None:
        self.reqs = running  # the scheduler's list, shared: admission order, last = next victim
        self.rids = [r.request_id for r in running]
        self.tables = [kv.block_table(rid) for rid in self.rids]
        self.block_size = kv.block_size
        self.state = np.zeros((4, max(16, 2 * len(running))), dtype=np.int64)
        for i, r in enumerate(running):
            self.state[:, i] = (r.num_computed_tokens, r.prompt_tokens + r.num_output_done,
                                r.num_output_done, r.output_tokens)
        self.pending: StepPlan | None = None  # the plan on_step_done may apply with apply()
        # the step being scheduled/applied: rows [0, _count) in bulk (_new is None when
        # every one is a plain decode), then the _admitted rows one by one
        self._count = 0
        self._new: np.ndarray | None = None
        self._emits: np.ndarray | None = None
        self._first_rows: list[int] = []
        self._admitted: list[tuple[int, int, bool]] = []
        # a plan that covers every row and makes each emit leaves only plain decodes
        self._covers_all = False
        self._all_decode = False  # true between apply() of such a plan and the next schedule
        self._run_rows: list[tuple[list[int], list[int]]] = []  # decode_run(): per phase

    def sync(self) -> None:
        """Write the live counters back into the Request objects."""
        n = len(self.reqs)
        computed = self.state[COMPUTED, :n].tolist()
        done = self.state[DONE, :n].tolist()
        for req, c, d in zip(self.reqs, computed, done, strict=True):
            req.num_computed_tokens = c
            req.num_output_done = d

    def admitted(self, req: Request, table: tuple[int, ...], new: int) -> None:
        """Give a request just appended to the shared list (exact counters) its columns."""
        row = len(self.reqs) - 1
        assert self.reqs[row] is req
        if row == self.state.shape[1]:
            self.state = np.concatenate((self.state, np.zeros_like(self.state)), axis=1)
        known = req.prompt_tokens + req.num_output_done
        self.state[:, row] = (req.num_computed_tokens, known, req.num_output_done,
                              req.output_tokens)
        self.rids.append(req.request_id)
        self.tables.append(table)
        self._admitted.append((row, new, req.num_computed_tokens + new == known))

    def _pop_tail(self) -> Request:
        """Remove the most recently admitted request, synced, for preemption."""
        row = len(self.reqs) - 1
        req = self.reqs.pop()
        self.rids.pop()
        self.tables.pop()
        req.num_computed_tokens = int(self.state[COMPUTED, row])  # swap keeps them
        req.num_output_done = int(self.state[DONE, row])
        return req

    def schedule_running(self, budget: int, kv: KVManager, step: PlanBuilder,
                         preempt: Callable[[Request], None], preempted: list[int],
                         naming: PagedBlockManager | None = None) -> int:
        """Give running sequences their tokens in admission order; returns the budget left.

        vLLM's rule: each catches up to its known tokens while
        budget lasts; a table that cannot grow preempts from the tail (`preempt`).
        `naming` (a prefix-caching pool) names the blocks this step fills, before
        any admission: a running table has its first computed // block_size blocks
        named, so only the rows that cross a block boundary need the call.
        """
        self._admitted = []
        all_decode, self._all_decode = self._all_decode, False
        n = len(self.reqs)
        self._first_rows = []
        if n == 0:
            self._count, self._new, self._covers_all = 0, None, True
            return budget
        if all_decode and n <= budget:
            return self._schedule_decodes(n, budget, kv, step, preempt, preempted, naming)
        state = self.state
        computed = state[COMPUTED, :n]
        remaining = state[KNOWN, :n] - computed  # >= 1 for every running sequence
        ends = np.cumsum(remaining)
        total = int(ends[-1])
        if total <= budget:
            new, count, left = remaining, n, budget - total
        else:
            count = int(np.searchsorted(ends, budget, side="right"))  # those that fit whole
            before = int(ends[count - 1]) if count else 0
            if before < budget:  # the next one gets a chunk
                new = remaining[:count + 1].copy()
                new[count] = budget - before
                count += 1
            else:
                new = remaining[:count]
            left = 0
        computed = computed[:count]
        target = computed + new
        bs = self.block_size
        grow = (-(-target // bs) > -(-computed // bs)).nonzero()[0]  # a superset is harmless
        if grow.size:
            count = min(count, self._grow_tables(grow.tolist(), target[grow].tolist(), kv,
                                                 preempt, preempted))
        computed, new = computed[:count], new[:count]
        if naming is not None:
            ends = computed + new
            for i in (ends // bs > computed // bs).nonzero()[0].tolist():
                naming.cache_computed(self.rids[i], int(ends[i]))
        self._fill(step, count, computed, new, remaining[:count])
        return left

    def _schedule_decodes(self, n: int, budget: int, kv: KVManager, step: PlanBuilder,
                          preempt: Callable[[Request], None], preempted: list[int],
                          naming: PagedBlockManager | None) -> int:
        """Every running sequence is one plain decode: the saturated steady state."""
        computed = self.state[COMPUTED, :n]
        contexts = computed.tolist()
        # the next token opens a block where computed is a multiple of the block size
        rows = (computed % self.block_size == 0).nonzero()[0].tolist()
        if rows:
            rids, tables = self.rids, self.tables
            grown = kv.append_block_each([rids[i] for i in rows])
            if grown is not None:
                for i, table in zip(rows, grown, strict=True):
                    tables[i] = table
            else:  # the pool runs dry: one by one, preempting from the tail
                n = self._grow_tables(rows, [contexts[i] + 1 for i in rows], kv, preempt,
                                      preempted)
                del contexts[n:]
                computed = computed[:n]
        if naming is not None:  # the decoded token fills its block
            for i in ((computed + 1) % self.block_size == 0).nonzero()[0].tolist():
                naming.cache_computed(self.rids[i], contexts[i] + 1)
        step.request_ids = self.rids[:n]
        step.num_new = [1] * n
        step.contexts = contexts
        step.tables = self.tables[:n]
        step.prefills = [False] * n
        step.emits = [True] * n
        if n:
            step.num_decodes = n
            step.decode_sum = int(np.add.reduce(computed))
            step.decode_max = int(np.maximum.reduce(computed))
        self._count, self._new, self._emits, self._covers_all = n, None, None, True
        return budget - n

    def _grow_tables(self, rows: list[int], targets: list[int], kv: KVManager,
                     preempt: Callable[[Request], None], preempted: list[int]) -> int:
        """Grow tables one by one, preempting from the tail when blocks run out.

        Returns how many sequences are left running.
        """
        rids, tables = self.rids, self.tables
        for i, tokens in zip(rows, targets, strict=True):
            if i >= len(rids):
                break  # preempted already
            table = kv.append_slots(rids[i], tokens)
            while table is None:
                victim = self._pop_tail()
                preempt(victim)
                preempted.append(victim.request_id)
                if len(rids) == i:
                    break  # it preempted itself: everyone after it is gone too
                table = kv.append_slots(rids[i], tokens)
            if table is None:
                break
            tables[i] = table
        return len(rids)

    def _fill(self, step: PlanBuilder, count: int, computed: np.ndarray, new: np.ndarray,
              remaining: np.ndarray) -> None:
        """Write the running sequences' columns and shape terms into the step."""
        decode = (remaining == 1) & (self.state[DONE, :count] > 0)
        emits = new == remaining
        num_decodes = int(np.count_nonzero(decode))
        step.request_ids = self.rids[:count]
        step.num_new = new.tolist()
        step.contexts = computed.tolist()
        step.tables = self.tables[:count]
        step.emits = emits.tolist()
        if num_decodes:
            contexts = computed[decode]
            step.num_decodes = num_decodes
            step.decode_sum = int(np.add.reduce(contexts))
            step.decode_max = int(np.maximum.reduce(contexts))
        if num_decodes == count:
            step.prefills = [False] * count
        else:
            prefill = ~decode
            step.prefills = prefill.tolist()
            step.chunk_tokens = new[prefill].tolist()
            step.chunk_contexts = computed[prefill].tolist()
            self._first_rows = (prefill & emits).nonzero()[0].tolist()
        self._count, self._new, self._emits = count, new, emits
        self._covers_all = count == len(self.reqs) and False not in step.emits

    def apply(self, now: float, kv: KVManager,
              in_flight: dict[int, Request]) -> list[Request]:
        """Apply the pending plan: advance counters, stamp first tokens, retire finished."""
        state, reqs, count = self.state, self.reqs, self._count
        if self._new is None:
            state[COMPUTED:DONE + 1, :count] += 1  # plain decodes: one token in, one out
        elif count:
            state[COMPUTED, :count] += self._new
            state[KNOWN, :count] += self._emits
            state[DONE, :count] += self._emits
            for i in self._first_rows:
                req = reqs[i]
                if req.first_token_s is None:
                    req.first_token_s = now
        all_emit = self._covers_all
        for row, new, emits in self._admitted:
            req = reqs[row]
            done = req.num_output_done + emits
            state[COMPUTED:DONE + 1, row] = (req.num_computed_tokens + new,
                                             req.prompt_tokens + done, done)
            if emits:
                if req.first_token_s is None:
                    req.first_token_s = now
            else:
                all_emit = False
        self._all_decode = all_emit
        rows = count + len(self._admitted)
        self.pending = None
        finished = (state[DONE, :rows] == state[TARGET, :rows]).nonzero()[0]
        if not finished.size:
            return []
        return self._retire(finished.tolist(), now, kv, in_flight)

    def _retire(self, rows: list[int], now: float, kv: KVManager,
                in_flight: dict[int, Request]) -> list[Request]:
        """Finish these rows in plan order (block frees are ordered), then compact."""
        state, reqs = self.state, self.reqs
        n = len(reqs)
        finished: list[Request] = []
        for i in rows:
            req = reqs[i]
            req.num_computed_tokens = int(state[COMPUTED, i])
            req.num_output_done = req.output_tokens
            req.state = RequestState.FINISHED
            req.finish_s = now
            kv.free(req.request_id)
            del in_flight[req.request_id]
            finished.append(req)
        for i in reversed(rows):
            del reqs[i], self.rids[i], self.tables[i]
        if len(rows) <= 4:  # usually one or two: shift the tail left over each
            for i in reversed(rows):
                state[:, i:n - 1] = state[:, i + 1:n]
                n -= 1
        else:
            keep = np.ones(n, dtype=bool)
            keep[rows] = False
            state[:, :n - len(rows)] = state[:, :n][:, keep]
        return finished

    # -- runs of plain decodes (sim.core.decode_run) ------------------------------------
    def plain_decodes(self) -> bool:
        """Every running sequence's next step is one plain decode (apply() just saw to it)."""
        return self._all_decode and self.pending is None

    def decode_run(self, kv: KVManager, paged: bool, padded_batch: int, num_waiting: int,
                   kv_blocked: bool, max_steps: int) -> DecodeRun | None:
        """The next plain-decode steps before anyone finishes or the pool runs short.

        Step s (from 0) gives row i a block when its context c_i + s is a multiple
        of the block size, i.e. when s = (-c_i) mod block size: its phase. The rows
        of one phase, in row order, are what _schedule_decodes would grow that step.
        """
        n = len(self.reqs)
        state = self.state
        computed = state[COMPUTED, :n]
        steps = min(int(np.minimum.reduce(state[TARGET, :n] - state[DONE, :n])) - 1, max_steps)
        if steps < 2:
            return None
        bs = self.block_size
        phase = (-computed) % bs
        per_phase = np.bincount(phase, minlength=bs)
        used = np.full(steps, kv.num_used_blocks, dtype=np.int64)
        if paged:
            taken = np.cumsum(per_phase[np.arange(steps) % bs])
            fits = int(np.searchsorted(taken, kv.num_free_blocks, side="right"))
            if fits < steps:
                steps = fits
                if steps < 2:
                    return None
                taken, used = taken[:steps], used[:steps]
            used += taken
        order = np.argsort(phase, kind="stable").tolist()
        rids, rows, start = self.rids, [], 0
        for count in per_phase.tolist():
            members = order[start:start + count]
            rows.append((members, [rids[i] for i in members]))
            start += count
        self._run_rows = rows
        shape = StepShape((), (), n, int(np.add.reduce(computed)),
                          int(np.maximum.reduce(computed)), max(padded_batch, n))
        return DecodeRun(steps, shape, used, num_waiting, not num_waiting, bs, kv_blocked)

    def advance(self, steps: int, kv: KVManager, naming: PagedBlockManager | None) -> None:
        """Apply the first `steps` steps of the last decode_run(): the same block calls in the
        same order as step by step (each step's new blocks, then the blocks it filled named)."""
        rows, tables, bs = self._run_rows, self.tables, self.block_size
        n = len(self.reqs)
        if naming is None:  # nothing between two steps' blocks: take them all in one call
            order = [rid for s in range(steps) for rid in rows[s % bs][1]]
            if order:
                grown = kv.append_block_each(order)
                assert grown is not None, "a decode run took more blocks than were free"
                table_of = kv.block_table
                for members, rids in rows[:steps]:
                    for i, rid in zip(members, rids, strict=True):
                        tables[i] = table_of(rid)
            self.state[COMPUTED:DONE + 1, :n] += steps
            self._run_rows = []
            return
        computed = self.state[COMPUTED, :n].tolist()
        for s in range(steps):
            members, rids = rows[s % bs]
            if members:
                grown = kv.append_block_each(rids)
                assert grown is not None, "a decode run took more blocks than were free"
                for i, table in zip(members, grown, strict=True):
                    tables[i] = table
            members, rids = rows[(s + 1) % bs]
            for i, rid in zip(members, rids, strict=True):
                naming.cache_computed(rid, computed[i] + s + 1)
        self.state[COMPUTED:DONE + 1, :n] += steps
        self._run_rows = []
