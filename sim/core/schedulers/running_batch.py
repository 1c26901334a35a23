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

from collections.abc import Callable, Sequence

import numpy as np

from sim.core.batching import padded_batch_size
from sim.core.decode_run import DecodeRun, FinishStep, RunSegment, decode_shape
from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers.plan_builder import PlanBuilder
from sim.core.schedulers.speculation import Speculation, emitted_each

# rows of RunningBatch.state; PREFILLING: 1 when the last step left it mid-prompt (no drafts)
COMPUTED, KNOWN, DONE, TARGET, DRAFTED, ACCEPTED, PREFILLING = range(7)
# the Request counters the columns hold while it runs
COUNTERS = {"num_computed_tokens": COMPUTED, "num_output_done": DONE,
            "spec_drafted": DRAFTED, "spec_accepted": ACCEPTED}


def _part(run: DecodeRun, steps: int, shape: StepShape, used: np.ndarray) -> DecodeRun:
    """`steps` steps of `run` from one with `shape`, nobody finishing, `used` blocks."""
    return DecodeRun(steps, shape, used, run.num_waiting, run.stops_at_arrival, run.block_size,
                     run.kv_blocked)


class RunningBatch:
    """Per-sequence counters in one (7, capacity) int64 array, aligned with Python lists."""

    __slots__ = ("reqs", "rids", "tables", "state", "block_size", "spec", "pending",
                 "prefill_scheduled", "_count", "_new", "_emits", "_first_rows", "_admitted",
                 "_covers_all", "_all_decode")

    def __init__(self, running: list[Request], kv: KVManager, spec: Speculation) -> None:
        self.reqs = running  # the scheduler's list, shared: admission order, last = next victim
        self.rids = [r.request_id for r in running]
        self.tables = [kv.block_table(rid) for rid in self.rids]
        self.block_size = kv.block_size
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
        # every one is a plain decode), then the _admitted rows one by one
        self._count = 0
        self._new: np.ndarray | None = None
        self._emits: np.ndarray | None = None
        self._first_rows: list[int] = []
        self._admitted: list[tuple[int, int, bool]] = []
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
        req._live = None  # noqa: SLF001
        req.num_computed_tokens = computed
        req.num_output_done = done
        req.spec_drafted = drafted
        req.spec_accepted = accepted

    def admitted(self, req: Request, table: tuple[int, ...], new: int, drafts: int = 0) -> None:
        """Give a request just appended to the shared list (exact counters) its columns;
        `drafts` of its `new` tokens are drafts (a padded admission)."""
        row = len(self.reqs) - 1
        assert self.reqs[row] is req
        if row == self.state.shape[1]:
            self.state = np.concatenate((self.state, np.zeros_like(self.state)), axis=1)
        known = req.prompt_tokens + req.num_output_done
        self.state[:, row] = (req.num_computed_tokens, known, req.num_output_done,
                              req.output_tokens, req.spec_drafted, req.spec_accepted, 0)
        self.rids.append(req.request_id)
        self.tables.append(table)
        self._admitted.append((row, new, req.num_computed_tokens + new - drafts == known))
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
              remaining: np.ndarray, spec: np.ndarray | None) -> None:
        """Write the running sequences' columns and shape terms into the step; `spec`: the
        draft tokens among each one's `new` (speculation on)."""
        own = new if spec is None else new - spec  # the tokens it computes for itself
        decode = (remaining == 1) & (self.state[DONE, :count] > 0)  # then own == 1 too
        emits = own == remaining
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
        by request id), column by column in _apply_each.
        """
        if plan is not self.pending:
            row_of = {rid: i for i, rid in enumerate(self.rids)}
            return self._apply_each(plan, [row_of[rid] for rid in plan.request_ids], result,
                                    now, kv, in_flight)
        if plan.num_spec_tokens or result.num_emitted or self.spec.k:
            rows = list(range(self._count)) + [row for row, _, _ in self._admitted]
            return self._apply_each(plan, rows, result, now, kv, in_flight)
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
        return self._retire([rows[j] for j in finished.tolist()], now, kv, in_flight)

    def _retire(self, rows: list[int], now: float, kv: KVManager,
                in_flight: dict[int, Request]) -> list[Request]:
        """Finish these rows in plan order (block frees are ordered), then compact."""
        state, reqs = self.state, self.reqs
        n = len(reqs)
        finished: list[Request] = []
        for i in rows:
            req = reqs[i]
            self._write_back(req, i)
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

    def decode_run(self, kv: KVManager, paged: bool, graph_sizes: tuple[int, ...],
                   num_waiting: int, kv_blocked: bool, max_steps: int) -> DecodeRun | None:
        """The next plain-decode steps: across finishes while nobody waits, else up to the first
        finisher's step; cut where the free pool (frees aside) cannot cover the blocks.

        Step s (from 0) gives row i a block when its context c_i + s is a multiple
        of the block size, i.e. when s = (-c_i) mod block size: its phase, from its
        first step to the step it finishes in.
        """
        n = len(self.reqs)
        state = self.state
        computed = state[COMPUTED, :n]
        finish = state[TARGET, :n] - state[DONE, :n] - 1  # the step each one finishes in
        last = int(np.minimum.reduce(finish)) if num_waiting else int(np.maximum.reduce(finish))
        steps = min(last + 1, max_steps)
        if steps < 2:
            return None
        bs = self.block_size
        phase = (-computed) % bs
        used = np.full(steps, kv.num_used_blocks, dtype=np.int64)
        gone = (finish < steps - 1).nonzero()[0].tolist()  # finish before the last step
        if paged:
            taken = np.bincount(phase, minlength=bs)[np.arange(steps) % bs]
            if gone:
                for f, ph in zip(finish[gone].tolist(), phase[gone].tolist(), strict=True):
                    taken[f + 1 + (ph - f - 1) % bs::bs] -= 1  # the block steps after it left
            taken = np.cumsum(taken)
            fits = int(np.searchsorted(taken, kv.num_free_blocks, side="right"))
            if fits < steps:
                steps = fits
                if steps < 2:
                    return None
                taken, used = taken[:steps], used[:steps]
            used += taken
        segments = [(0, self._shape(n, int(np.add.reduce(computed)),
                                    int(np.maximum.reduce(computed)), graph_sizes))]
        if gone:  # the rows left after each finishers' step: a suffix in finish order
            by_finish = np.argsort(finish, kind="stable")
            ends = finish[by_finish]
            contexts = computed[by_finish]
            suffix_sum = np.cumsum(contexts[::-1])[::-1].tolist()
            suffix_max = np.maximum.accumulate(contexts[::-1])[::-1].tolist()
            ends_at = np.unique(ends[ends < steps - 1])
            for f, left in zip(ends_at.tolist(),
                               np.searchsorted(ends, ends_at, side="right").tolist(), strict=True):
                m, s = n - left, f + 1
                segments.append((s, self._shape(m, suffix_sum[left] + s * m,
                                                suffix_max[left] + s, graph_sizes)))
        return DecodeRun(steps, segments[0][1], used, num_waiting, not num_waiting, bs,
                         kv_blocked, tuple(segments))

    @staticmethod
    def _shape(n: int, context_sum: int, context_max: int,
               graph_sizes: tuple[int, ...]) -> StepShape:
        """A plain-decode step's shape: n decodes with these contexts (padded for graphs)."""
        padded = padded_batch_size(n, graph_sizes) if graph_sizes else 0
        return StepShape((), (), n, context_sum, context_max, max(padded, n))

    def advance(self, run: DecodeRun, begin: int, end: int, step_end_s: Sequence[float],
                kv: KVManager, paged: bool, naming: PagedBlockManager | None,
                in_flight: dict[int, Request]) -> list[RunSegment]:
        """Apply steps [begin, end) of `run` (the steps before `begin` applied already):
        segment by segment, the same block calls in the same order as step by step (each
        step's new blocks, then the blocks it filled named), then the finishers of a
        segment's last step retired (their blocks freed) at its end, `step_end_s[s]`."""
        out: list[RunSegment] = []
        for start, length, shape in run.segment_lengths():
            first, stop = max(start, begin), min(start + length, end)
            if first >= stop:
                continue
            k = stop - first
            if first > start:
                shape = decode_shape(shape, first - start)
            used = self._take_blocks(k, kv, paged, naming)
            n = len(self.reqs)
            state = self.state
            state[COMPUTED:DONE + 1, :n] += k
            done = (state[DONE, :n] == state[TARGET, :n]).nonzero()[0]
            if not done.size:
                out.append(RunSegment(first, _part(run, k, shape, used), None))
                continue
            plan = StepPlan(tuple(self.rids), (1,) * n, tuple((state[COMPUTED, :n] - 1).tolist()),
                            tuple(self.tables), (False,) * n, (True,) * n,
                            decode_shape(shape, k - 1))
            held = int(used[-1]) * self.block_size
            finished = self._retire(done.tolist(), step_end_s[stop - 1], kv, in_flight)
            out.append(RunSegment(first, _part(run, k - 1, shape, used[:k - 1]),
                                  FinishStep(plan, finished, kv.num_used_blocks, held,
                                             len(self.reqs))))
        return out

    def _take_blocks(self, steps: int, kv: KVManager, paged: bool,
                     naming: PagedBlockManager | None) -> np.ndarray:
        """Give the rows their blocks for the next `steps` plain decodes (nobody leaves in
        between); returns the blocks in use while each step runs."""
        n, bs, tables, rids = len(self.reqs), self.block_size, self.tables, self.rids
        computed = self.state[COMPUTED, :n]
        phase = (-computed) % bs
        per_phase = np.bincount(phase, minlength=bs)
        used0 = kv.num_used_blocks
        if naming is None:  # nothing between two steps' blocks: take them all in one call
            # step s grows the rows of phase s % bs, in row order
            by_phase = np.argsort(phase, kind="stable")
            cycles, rest = divmod(steps, bs)
            order = by_phase[:int(np.searchsorted(phase[by_phase], rest))]  # phases < rest
            if cycles:
                order = np.concatenate((np.tile(by_phase, cycles), order))
            if order.size:
                rows = order.tolist()
                grown = kv.append_block_each([rids[i] for i in rows])
                assert grown is not None, "a decode run took more blocks than were free"
                for i, table in zip(rows, grown, strict=True):
                    tables[i] = table  # a row's last entry is its final table
        else:
            order = np.argsort(phase, kind="stable").tolist()
            rows, at = [], 0
            for count in per_phase.tolist():
                members = order[at:at + count]
                rows.append((members, [rids[i] for i in members]))
                at += count
            contexts = computed.tolist()
            for s in range(steps):
                members, member_rids = rows[s % bs]
                if members:
                    grown = kv.append_block_each(member_rids)
                    assert grown is not None, "a decode run took more blocks than were free"
                    for i, table in zip(members, grown, strict=True):
                        tables[i] = table
                members, member_rids = rows[(s + 1) % bs]
                for i, rid in zip(members, member_rids, strict=True):
                    naming.cache_computed(rid, contexts[i] + s + 1)
        if not paged:
            return np.full(steps, used0, dtype=np.int64)
        return used0 + np.cumsum(per_phase[np.arange(steps) % bs])
