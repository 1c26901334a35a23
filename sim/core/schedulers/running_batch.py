"""The continuous scheduler's running set as a struct of numpy arrays.

Why: at batch sizes in the hundreds, per-sequence Python work in schedule() and
on_step_done() dominated the simulator (~2.7 us per sequence per step). Here a
step is a fixed number of numpy operations whatever the batch size; Python
touches only the sequences that need a new KV block (about one in block_size),
emit their first token, finish, are preempted or are newly admitted. It is the
only running set: speculative decoding is columns too (k_i per sequence, the
drafted and accepted counts, whether a sequence is still prefilling).

A running request's progress (computed and emitted tokens, speculation counts)
lives in these columns: its Request reads and writes them here while it runs
(`Request._live`, sim.core.request.LiveCounters) and takes them back when it
leaves the set (finished, preempted, aborted), so a Request is exact at any time
and no step writes one.

Without speculation, after every applied step a running table holds exactly
ceil(computed / block size) blocks (blocks are only ever added to cover the
tokens a step computes), so a plain decode needs a block exactly when computed
is a multiple of it. Speculation's rolled-back drafts may leave more blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers.plan_builder import PlanBuilder
from sim.core.schedulers.speculation import Speculation, emitted_each

# rows of RunningBatch.state; PREFILLING: 1 when the last step left it mid-prompt (no drafts)
COMPUTED, KNOWN, DONE, TARGET, DRAFTED, ACCEPTED, PREFILLING = range(7)
# up to this many rows a Python pass over a column's list beats numpy's cost per call
FEW_ROWS = 32
# the Request counters the columns hold while it runs
COUNTERS = {"num_computed_tokens": COMPUTED, "num_output_done": DONE,
            "spec_drafted": DRAFTED, "spec_accepted": ACCEPTED}


class RunningBatch:
    """Per-sequence counters in one (7, capacity) int64 array, aligned with Python lists."""

    __slots__ = ("reqs", "rids", "tables", "state", "block_size", "spec", "pending",
                 "prefill_scheduled", "_count", "_new", "_emits", "_first_rows", "_admitted",
                 "_held", "_covers_all", "_all_decode", "_mask")

    def __init__(self, running: list[Request], kv: KVManager, spec: Speculation) -> None:
        self.reqs = running  # the scheduler's list, shared: admission order, last = next victim
        self.rids = [r.request_id for r in running]
        self.tables = [kv.block_table(rid) for rid in self.rids]
        self.block_size = bs = kv.block_size
        # x & _mask == x % block_size for a power-of-two block size (-1: use %)
        self._mask = bs - 1 if not bs & (bs - 1) else -1
        self.spec = spec  # the scheduler's: k may change between steps
        self.state = np.zeros((7, max(16, 2 * len(running))), dtype=np.int64)
        for i, r in enumerate(running):
            self.state[:, i] = (r.num_computed_tokens, r.prompt_tokens + r.num_output_done,
                                r.num_output_done, r.output_tokens, r.spec_drafted,
                                r.spec_accepted, 0)
            r._live = self  # noqa: SLF001 - the counters now live here
        self.prefill_scheduled = False  # a scheduled running sequence is mid-prompt (pads())
        self.pending: StepPlan | None = None  # the plan on_step_done may apply with apply()
        # the step being scheduled/applied: rows [0, _count) in bulk (_new is None when
        # every one is a plain decode), then the rows the _admitted requests took after
        # them, in order; `_held`: (row, new tokens) of those among them that do not emit
        self._count = 0
        self._new: np.ndarray | None = None
        self._emits: np.ndarray | None = None
        self._first_rows: list[int] = []
        self._admitted: list[Request] = []
        self._held: list[tuple[int, int]] = []
        # a plan that covers every row and makes each emit leaves only plain decodes
        self._covers_all = False
        self._all_decode = False  # true between apply() of such a plan and the next schedule

    # -- a running Request's counters (sim.core.request.LiveCounters) ----------------
    def counter(self, request: Request, name: str) -> int:
        return int(self.state[COUNTERS[name], self.reqs.index(request)])

    def set_counter(self, request: Request, name: str, value: int) -> None:
        row = self.reqs.index(request)
        if name == "num_output_done":
            self.state[KNOWN, row] = request.prompt_tokens + value
        self.state[COUNTERS[name], row] = value

    def _write_back(self, req: Request, row: int) -> None:
        """Hand a leaving request its counters: its own again from now on."""
        computed, _, done, _, drafted, accepted, _ = self.state[:, row].tolist()
        req.take_counters(computed, done, drafted, accepted)

    def admitted(self, req: Request, table: tuple[int, ...], new: int,
                 counters: tuple[int, int, int, int], emits: bool) -> None:
        """Give a request just appended to the shared list its columns: `counters` are its
        (computed, output done, drafted, accepted) before the step, `new` the tokens it is
        scheduled, `emits` whether they bring it to its known tokens."""
        row = len(self.reqs) - 1
        assert self.reqs[row] is req and row == self._count + len(self._admitted)
        if row == self.state.shape[1]:
            self.state = np.concatenate((self.state, np.zeros_like(self.state)), axis=1)
        computed, done, drafted, accepted = counters
        column = self.state[:, row]
        column[COMPUTED] = computed
        column[KNOWN] = req.prompt_tokens + done
        column[DONE] = done
        column[TARGET] = req.output_tokens
        column[DRAFTED] = drafted
        column[ACCEPTED] = accepted
        column[PREFILLING] = 0
        self.rids.append(req.request_id)
        self.tables.append(table)
        self._admitted.append(req)
        if not emits:
            self._held.append((row, new))
        req._live = self  # noqa: SLF001 - the counters now live here

    def _pop_tail(self) -> Request:
        """Remove the most recently admitted request, synced, for preemption."""
        row = len(self.reqs) - 1
        req = self.reqs.pop()
        self.rids.pop()
        self.tables.pop()
        self._write_back(req, row)  # swap keeps the counters
        return req

    def remove(self, req: Request) -> None:
        """Take a running request out between steps (an abort), synced."""
        row = self.reqs.index(req)
        self._write_back(req, row)
        n = len(self.reqs)
        del self.reqs[row], self.rids[row], self.tables[row]
        self.state[:, row:n - 1] = self.state[:, row + 1:n]

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
              remaining: np.ndarray, spec: np.ndarray | None) -> None:
        """Write the running sequences' columns and shape terms into the step; `spec`: the
        draft tokens among each one's `new` (speculation on)."""
        own = new if spec is None else new - spec  # the tokens it computes for itself
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

    def apply(self, plan: StepPlan, result: StepResult, now: float, kv: KVManager,
              in_flight: dict[int, Request]) -> list[Request]:
        """Apply a step: advance counters, stamp first tokens, retire the finished.

        The pending plan without speculation (the hot path) is applied from what
        schedule_running kept; a speculative step, or any other plan (an older one,
        by request id), column by column in _apply_each. A row that emits computed
        up to its known tokens (a plain decode's one, an admission's prompt): its
        computed becomes its known count, then known and done grow by one.
        """
        if plan is not self.pending:
            row_of = {rid: i for i, rid in enumerate(self.rids)}
            return self._apply_each(plan, [row_of[rid] for rid in plan.request_ids], result,
                                    now, kv, in_flight)
        count, admitted = self._count, self._admitted
        rows = count + len(admitted)
        if plan.num_spec_tokens or result.num_emitted or self.spec.k:
            return self._apply_each(plan, list(range(rows)), result, now, kv, in_flight)
        state, held, new = self.state, self._held, self._new
        if new is None and not held:  # every row emits: one pass over them all
            state[COMPUTED, :rows] = state[KNOWN, :rows]
            state[KNOWN:DONE + 1, :rows] += 1
        else:
            if new is None:
                state[COMPUTED:DONE + 1, :count] += 1  # plain decodes: one token in, one out
            elif count:
                state[COMPUTED, :count] += new
                state[KNOWN, :count] += self._emits
                state[DONE, :count] += self._emits
                reqs = self.reqs
                for i in self._first_rows:
                    req = reqs[i]
                    if req.first_token_s is None:
                        req.first_token_s = now
            if held:
                self._apply_admitted_each(now)
                admitted = []
            elif admitted:
                state[COMPUTED, count:rows] = state[KNOWN, count:rows]
                state[KNOWN:DONE + 1, count:rows] += 1
        for req in admitted:
            if req.first_token_s is None:
                req.first_token_s = now
        self._all_decode = self._covers_all and not held
        self.pending = None
        finished = (state[DONE, :rows] == state[TARGET, :rows]).nonzero()[0]
        if not finished.size:
            return []
        return self.retire(finished.tolist(), now, kv, in_flight)

    def _apply_admitted_each(self, now: float) -> None:
        """Apply the admitted rows one by one, some of which did not emit (`_held`)."""
        state, count, held = self.state, self._count, dict(self._held)
        for j, req in enumerate(self._admitted):
            row = count + j
            new = held.get(row)
            if new is not None:  # a chunk short of its known tokens: computed only
                state[COMPUTED, row] += new
                continue
            state[COMPUTED, row] = state[KNOWN, row]
            state[KNOWN, row] += 1
            state[DONE, row] += 1
            if req.first_token_s is None:
                req.first_token_s = now

    def _apply_each(self, plan: StepPlan, rows: list[int], result: StepResult, now: float,
                    kv: KVManager, in_flight: dict[int, Request]) -> list[Request]:
        """Apply `plan`, whose sequences are these rows (ascending): a drafting sequence
        emitted 1 + a_i tokens (`result`), of which it keeps what its scripted output has
        room for, and its rejected drafts roll back (computed = context + kept); every
        other one computed its new tokens and emitted at most one. Each sequence in the
        plan learns whether it is still prefilling (it did not emit)."""
        counts = emitted_each(plan, result)
        state = self.state
        new = np.array(plan.num_new_tokens, dtype=np.int64)
        emits = counts > 0
        drafting = np.array(plan.num_spec_tokens or (0,) * len(rows), dtype=np.int64) > 0
        idx: slice | list[int] = slice(0, len(rows)) if rows == list(range(len(rows))) else rows
        done = state[DONE, idx]
        first = (emits & (done == 0)).nonzero()[0].tolist()  # before done moves (a view)
        kept = np.minimum(counts, state[TARGET, idx] - done)
        out = np.where(drafting, kept, emits)
        state[COMPUTED, idx] += np.where(drafting, kept, new)
        state[KNOWN, idx] += out
        state[DONE, idx] += out
        state[DRAFTED, idx] += np.where(drafting, new - 1, 0)
        state[ACCEPTED, idx] += np.where(drafting, counts - 1, 0)
        state[PREFILLING, idx] = ~emits
        reqs = self.reqs
        for j in first:
            reqs[rows[j]].first_token_s = now
        self._all_decode = False
        if plan is self.pending:
            self.pending = None
        finished = (state[DONE, idx] == state[TARGET, idx]).nonzero()[0]
        if not finished.size:
            return []
        return self.retire([rows[j] for j in finished.tolist()], now, kv, in_flight)

    def retire(self, rows: list[int], now: float, kv: KVManager,
               in_flight: dict[int, Request]) -> list[Request]:
        """Finish these rows in plan order (block frees are ordered), then compact."""
        state, reqs, rids, tables = self.state, self.reqs, self.rids, self.tables
        n = len(reqs)
        finished = [reqs[i] for i in rows]
        free = kv.free
        for req, i in zip(finished, rows, strict=True):
            self._write_back(req, i)
            req.state = RequestState.FINISHED
            req.finish_s = now
            rid = rids[i]
            free(rid)
            del in_flight[rid]
        if len(rows) <= 4:  # usually one or two: shift the tail left over each
            for i in reversed(rows):
                del reqs[i], rids[i], tables[i]
                n -= 1
                if i < n:
                    state[:, i:n] = state[:, i + 1:n + 1]
        else:
            for i in reversed(rows):
                del reqs[i], rids[i], tables[i]
            keep = np.ones(n, dtype=bool)
            keep[rows] = False
            state[:, :n - len(rows)] = state[:, :n][:, keep]
        return finished

    # -- runs of plain decodes: batch_runs.py ----------------------------------------------
    def plain_decodes(self) -> bool:
        """Every running sequence's next step is one plain decode (apply() just saw to it)."""
        return self._all_decode and self.pending is None
