"""The running set's pass of a step: vLLM's rule for who gets how many tokens.

RunningBatch is the continuous scheduler's running set (running_columns.py holds
its columns: membership, counters, apply, retirement). This module adds the one
rule that reads them to schedule a step: every running sequence, in admission
order, catches up to its known tokens while the token budget lasts (a decode plus
its drafts when speculating), chunking the one the budget ends in, growing the
tables the new tokens reach and preempting from the tail when the pool runs dry.
It is apart because it is the part vLLM's parity pins down line by line
(docs/vllm_parity.md) and the part the saturated steady state spends its time in
(_schedule_decodes); the columns' bookkeeping changes for other reasons.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan
from sim.core.request import Request
from sim.core.schedulers.plan_builder import PlanBuilder
from sim.core.schedulers.running_columns import (
    COMPUTED,
    DONE,
    KNOWN,
    PREFILLING,
    TARGET,
    RunningColumns,
)

# up to this many rows a Python pass over a column's list beats numpy's cost per call
FEW_ROWS = 32


class RunningBatch(RunningColumns):
    """The running set: its columns, and the running-set pass of each step over them."""

    __slots__ = ()

    def schedule_running(self, budget: int, kv: KVManager, step: PlanBuilder,
                         preempt: Callable[[Request], None], preempted: list[int],
                         naming: PagedBlockManager | None = None) -> int:
        """Give running sequences their tokens in admission order; returns the budget left.

        vLLM's rule: each catches up to its known tokens (a decode plus its k drafts,
        capped by max_model_len, when speculating) while budget lasts, each also
        costing the method's draft slots; a table that cannot grow preempts from the
        tail (`preempt`). `naming` (a prefix-caching pool) names the blocks this step
        fills, before any admission: a running table has its first computed //
        block_size blocks named, so only the rows that cross a block boundary need
        the call (drafts are never named).
        """
        self._admitted = []
        self._held = []
        self.prefill_scheduled = False
        all_decode, self._all_decode = self._all_decode, False
        n = len(self.reqs)
        self._first_rows = []
        if n == 0:
            self._count, self._new, self._covers_all = 0, None, True
            return budget
        spec = self.spec
        k = spec.k
        if all_decode and n <= budget and not k:
            return self._schedule_decodes(n, budget, kv, step, preempt, preempted, naming)
        state = self.state
        computed = state[COMPUTED, :n]
        remaining = state[KNOWN, :n] - computed  # >= 1 for every running sequence
        slots = 0
        if k:
            drafts = spec.drafts_each(remaining, state[DONE, :n], state[PREFILLING, :n])
            want = spec.cap_each(computed, remaining + drafts)
            slots = spec.draft_slots
            ends = np.cumsum(want + slots if slots else want)
        else:
            want = remaining
            ends = np.cumsum(remaining)
        total = int(ends[-1])
        if total <= budget:
            new, count, left = want, n, budget - total
        else:
            count = int(np.searchsorted(ends, budget, side="right"))  # those that fit whole
            before = int(ends[count - 1]) if count else 0
            if budget - before > slots:  # the next one gets a chunk
                new = want[:count + 1].copy()
                new[count] = budget - before - slots
                count += 1
            else:
                new = want[:count]
            left = 0
        computed = computed[:count]
        target = computed + new
        slot_target = spec.slots_each(target) if k else target
        bs = self.block_size
        # a superset of the rows whose table must grow is harmless (append_slots: no-op)
        grow = (-(-slot_target // bs) > -(-computed // bs)).nonzero()[0]
        if grow.size:
            count = min(count, self._grow_tables(grow.tolist(), slot_target[grow].tolist(), kv,
                                                 preempt, preempted))
        computed, new, remaining = computed[:count], new[:count], remaining[:count]
        if naming is not None:
            ends = computed + new
            if k:
                ends = np.minimum(ends, remaining + computed)
            for i in (ends // bs > computed // bs).nonzero()[0].tolist():
                naming.cache_computed(self.rids[i], int(ends[i]))
        spec_tokens = None
        if k:
            spec_tokens = np.where(drafts[:count] > 0, np.maximum(new - remaining, 0), 0)
            self.prefill_scheduled = bool(state[PREFILLING, :count].any())
        self._fill(step, count, computed, new, remaining, spec_tokens)
        return left

    def schedule_running_ahead(self, budget: int, kv: KVManager, step: PlanBuilder,
                               preempt: Callable[[Request], None], preempted: list[int],
                               naming: PagedBlockManager | None, ahead: StepPlan,
                               max_model_len: int | None) -> int:
        """schedule_running while `ahead`, the last plan, still runs (vLLM's async scheduling).

        vLLM's AsyncScheduler counts an outstanding step optimistically: its tokens as
        computed, one output placeholder per sequence it makes emit (plus its drafts),
        and k draft placeholders for such a sequence's next step. Here those counts are
        derived from `ahead` (the columns hold what has been applied), and vLLM's running
        pass follows with them: a sequence whose outstanding step surely reaches its
        output length is skipped (the next ones still run), so is one that
        max_model_len leaves no position; the rest is schedule_running's rule. The
        rows that got tokens are left in `rows` (ascending, not all of the first ones),
        the block names capped at the tokens delivered (vLLM's `cache_blocks` at
        allocation, `min(computed + new, num_tokens)`).
        """
        self._admitted = []
        self._held = []
        self._all_decode = False
        self._first_rows = []
        self.prefill_scheduled = False
        n = len(self.reqs)
        if n == 0:
            self._count, self._new, self._covers_all, self.rows = 0, None, True, []
            return budget
        state, spec = self.state, self.spec
        k = spec.k
        # the outstanding step's sequences still running (the others finished or were
        # preempted since): the tokens it computes, whether it emits, the outputs (+ drafts)
        # it will deliver
        new_a = np.array(ahead.num_new_tokens, dtype=np.int64)
        emits_a = np.array(ahead.emits_token, dtype=bool)
        place_a = emits_a.astype(np.int64)
        if ahead.num_spec_tokens:
            place_a += np.where(emits_a, np.array(ahead.num_spec_tokens, dtype=np.int64), 0)
        mapped = self.plan_rows(ahead.request_ids)
        if mapped is None:
            in_ahead = np.ones(n, dtype=bool)
            emitted_ahead, inflight, placeholders = emits_a, new_a, place_a
        else:
            positions, at, _ = mapped
            in_ahead = np.zeros(n, dtype=bool)
            emitted_ahead = np.zeros(n, dtype=bool)
            inflight = np.zeros(n, dtype=np.int64)
            placeholders = np.zeros(n, dtype=np.int64)
            in_ahead[at] = True
            emitted_ahead[at] = emits_a[positions]
            inflight[at] = new_a[positions]
            placeholders[at] = place_a[positions]
        computed = state[COMPUTED, :n] + inflight
        delivered = state[KNOWN, :n]
        done = state[DONE, :n]
        remaining = delivered + placeholders - computed
        # the sequence's last scheduled step emitted (vLLM: it is not a prefill chunk)
        emitted_last = np.where(in_ahead, emitted_ahead, done > 0)
        want = remaining.copy()
        drafts = None
        if k:
            settled = (remaining == 1) & (done > 0) & (state[PREFILLING, :n] == 0)
            drafts = np.where(np.where(in_ahead, emitted_ahead, settled), k, 0)
            want += drafts
        if max_model_len is not None:
            want = np.minimum(want, max_model_len - computed - 1)
        # vLLM: skip when the outstanding step reaches max_tokens even if every draft fails
        sure_end = (placeholders > 0) & (computed + 2 - placeholders
                                         >= delivered - done + state[TARGET, :n])
        want = np.where(sure_end, 0, np.maximum(want, 0))
        slots = spec.draft_slots
        ends = np.cumsum(np.where(want > 0, want + slots, 0) if slots else want)
        total = int(ends[-1])
        new = want.copy()
        if total <= budget:
            left = budget - total
        else:
            count = int(np.searchsorted(ends, budget, side="right"))  # those that fit whole
            before = int(ends[count - 1]) if count else 0
            new[count:] = 0
            if budget - before > slots:  # the next one (it wants tokens) gets a chunk
                new[count] = budget - before - slots
            left = 0
        rows = new.nonzero()[0]
        target = computed + new
        slot_target = spec.slots_each(target) if k else target
        bs = self.block_size
        grow = rows[-(-slot_target[rows] // bs) > -(-computed[rows] // bs)]
        if grow.size:
            kept = self._grow_tables(grow.tolist(), slot_target[grow].tolist(), kv, preempt,
                                     preempted)
            rows = rows[rows < kept]
        if naming is not None:
            # a running table has its first computed // block_size blocks named (as
            # applied): only a row whose delivered tokens cross one needs the call
            rids = self.rids
            cached = np.minimum(target, delivered)
            named = rows[cached[rows] // bs > state[COMPUTED, rows] // bs]
            for i in named.tolist():
                naming.cache_computed(rids[i], int(cached[i]))
        spec_tokens = None
        if k:
            assert drafts is not None
            spec_tokens = np.where(drafts[rows] > 0, np.maximum(new[rows] - remaining[rows], 0),
                                   0)
            # vLLM's prefill_scheduled reads each running request's last scheduled step
            self.prefill_scheduled = bool(np.where(in_ahead[rows], ~emitted_ahead[rows],
                                                   state[PREFILLING, rows] > 0).any())
        self._fill(step, len(rows), computed[rows], new[rows], remaining[rows], spec_tokens,
                   (remaining[rows] == 1) & emitted_last[rows])
        self.rows = rows.tolist()
        return left

    def _schedule_decodes(self, n: int, budget: int, kv: KVManager, step: PlanBuilder,
                          preempt: Callable[[Request], None], preempted: list[int],
                          naming: PagedBlockManager | None) -> int:
        """Every running sequence is one plain decode: the saturated steady state."""
        computed = self.state[COMPUTED, :n]
        contexts = computed.tolist()
        few = n <= FEW_ROWS
        # the next token opens a block where computed is a multiple of the block size
        if few:
            bs = self.block_size
            rows = [i for i, context in enumerate(contexts) if not context % bs]
        else:
            mask = self._mask
            rows = ((computed & mask if mask >= 0 else computed % self.block_size) == 0
                    ).nonzero()[0].tolist()
        if rows:
            rids, tables = self.rids, self.tables
            grown = kv.append_blocks([rids[i] for i in rows], len(rows))
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
        step.size = step.decodes = n
        step.contexts = contexts
        if n:
            step.num_decodes = n
            step.decode_sum = sum(contexts)
            step.decode_max = max(contexts) if few else int(np.maximum.reduce(computed))
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
              remaining: np.ndarray, spec: np.ndarray | None,
              decode: np.ndarray | None = None) -> None:
        """Write the running sequences' columns and shape terms into the step; `spec`: the
        draft tokens among each one's `new` (speculation on); `decode`: which are decodes
        (default: the first `count` rows with one token left and some output)."""
        own = new if spec is None else new - spec  # the tokens it computes for itself
        if decode is None:
            decode = (remaining == 1) & (self.state[DONE, :count] > 0)  # then own == 1 too
        emits = own == remaining
        num_decodes = int(np.count_nonzero(decode))
        step.size = count
        step.num_new = new.tolist()
        step.contexts = computed.tolist()
        step.emits = emits.tolist()
        if num_decodes:
            contexts = computed[decode]
            step.num_decodes = num_decodes
            step.decode_sum = int(np.add.reduce(contexts))
            step.decode_max = int(np.maximum.reduce(contexts))
        if spec is not None and spec.any():
            drafting = spec > 0
            step.spec = spec.tolist()
            step.num_spec_decodes = int(np.count_nonzero(drafting))
            step.spec_tokens = int(np.add.reduce(spec))
            step.spec_depth = int(np.maximum.reduce(spec))
            step.spec_context_sum = int(np.add.reduce(computed[drafting]))
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
