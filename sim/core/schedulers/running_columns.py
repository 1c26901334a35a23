"""The continuous scheduler's running set as a struct of numpy arrays: its columns.

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

This module is the columns' bookkeeping: who is running (admitted, removed,
preempted from the tail), their counters, how a step's outcome advances them
(apply) and who retires. Which tokens each running sequence gets in a step, vLLM's
running-set rule, is running_batch.py's RunningBatch, built on this class: it
reads the columns and leaves what it scheduled for apply().
"""

from __future__ import annotations

import numpy as np

from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers.speculation import Speculation, emitted_each

# rows of RunningColumns.state; PREFILLING: 1 when the last step left it mid-prompt (no drafts)
COMPUTED, KNOWN, DONE, TARGET, DRAFTED, ACCEPTED, PREFILLING = range(7)
# the Request counters the columns hold while it runs
COUNTERS = {"num_computed_tokens": COMPUTED, "num_output_done": DONE,
            "spec_drafted": DRAFTED, "spec_accepted": ACCEPTED}


class RunningColumns:
    """Per-sequence counters in one (7, capacity) int64 array, aligned with Python lists.

    Column i is the i-th running sequence's; the columns past the last are scratch: every
    reader slices `[:, :n]`, admission writes a column whole, and a bulk update may run
    over whole rows (contiguous, a third of numpy's cost of a strided slice)."""

    __slots__ = ("reqs", "rids", "tables", "state", "block_size", "spec", "pending",
                 "prefill_scheduled", "_count", "_new", "_emits", "_first_rows", "_admitted",
                 "_held", "_covers_all", "_all_decode", "_mask", "rows")

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
        # async scheduling: the running rows the last schedule_running_ahead gave tokens
        self.rows: list[int] | None = None

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
        # (scheduled ahead of a running step, some running rows may have got no tokens)
        assert self.reqs[row] is req and (row == self._count + len(self._admitted)
                                          or self.rows is not None)
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
            # over the whole rows when the plan covers every sequence (the columns past the
            # last are scratch, written whole on admission): contiguous, a third of the cost
            cols = slice(None) if rows == len(self.reqs) else slice(rows)
            state[COMPUTED, cols] = state[KNOWN, cols]
            state[KNOWN:DONE + 1, cols] += 1
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
        first = (emits & (state[DONE, idx] == 0)).nonzero()[0].tolist()  # before done moves
        _credit(state, idx, emits, new, counts, drafting)
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

    def apply_behind(self, plan: StepPlan, result: StepResult, now: float, kv: KVManager,
                     in_flight: dict[int, Request], newer: StepPlan | None,
                     naming: PagedBlockManager | None
                     ) -> tuple[list[Request], list[int], np.ndarray]:
        """Apply `plan` while `newer`, scheduled after it, may still run (async scheduling).

        As _apply_each for the plan's sequences still running (they are ascending rows:
        only removals and appends happened since), then vLLM's AsyncScheduler extras, in
        plan order: each running sequence that emitted names the blocks its delivered
        tokens fill (`cache_blocks(computed - placeholders)`, the counts `newer` adds
        taken off), and then, if it finished, frees them; a sequence that finished or left
        already is skipped. Returns (the finished, the plan positions of sequences no
        longer running, the tokens each sequence of the plan emitted).
        """
        counts = emitted_each(plan, result)
        m = len(plan.request_ids)
        mapped = self.plan_rows(plan.request_ids)
        self._all_decode = False
        if newer is None:
            self.pending = None
        state = self.state
        new = np.array(plan.num_new_tokens, dtype=np.int64)
        drafting = np.array(plan.num_spec_tokens, dtype=np.int64) > 0 \
            if plan.num_spec_tokens else np.zeros(m, dtype=bool)
        idx: slice | np.ndarray
        if mapped is None:  # every running sequence, in order: the plan's rows are 0..m-1
            gone: list[int] = []
            rows = idx = slice(0, m)
            emitted = counts
        else:
            positions, rows, gone = mapped
            if not len(rows):
                return [], gone, counts
            idx = rows
            emitted, new, drafting = counts[positions], new[positions], drafting[positions]
        emits = emitted > 0
        done = state[DONE, idx].copy()
        old_computed = state[COMPUTED, idx].copy()
        first = (emits & (done == 0)).nonzero()[0].tolist()
        _credit(state, idx, emits, new, emitted, drafting)
        reqs, rids = self.reqs, self.rids
        row_list = range(m) if mapped is None else rows.tolist()
        for j in first:
            reqs[row_list[j]].first_token_s = now
        if naming is not None:
            # the tokens each emitting sequence has delivered: computed, plus what newer
            # computes for it less its placeholders (a running table has its first
            # computed // block_size blocks named: only a sequence crossing one is named)
            computed = state[COMPUTED, idx]
            if newer is not None:
                computed = computed + self._ahead_of(newer)[idx]
            bs = self.block_size
            for j in (emits & (computed // bs > old_computed // bs)).nonzero()[0].tolist():
                naming.cache_computed(rids[row_list[j]], int(computed[j]))
        finished = (state[DONE, idx] == state[TARGET, idx]).nonzero()[0]
        if not finished.size:
            if newer is None and not self.spec.k:  # a run of plain decodes may follow
                n = len(reqs)
                self._all_decode = bool(n) and bool(
                    ((state[KNOWN, :n] - state[COMPUTED, :n]) == 1).all()
                    and (state[DONE, :n] > 0).all())
            return [], gone, counts
        return (self.retire([row_list[j] for j in finished.tolist()], now, kv, in_flight), gone,
                counts)

    def plan_rows(self, request_ids: tuple[int, ...]
                  ) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
        """Where a plan's sequences run now: None when they are every running sequence in
        order (rows 0..n-1); else (the plan positions still running, their rows, ascending,
        and the positions no longer running). A plan's sequences still running keep their
        order: only removals and appends happen between its scheduling and its apply."""
        rids = self.rids
        if len(request_ids) == len(rids) and request_ids == tuple(rids):
            return None
        ids = np.array(request_ids, dtype=np.int64)
        if not rids:
            return (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
                    list(range(len(request_ids))))
        running = np.array(rids, dtype=np.int64)
        order = running.argsort(kind="stable")
        by_id = running[order]
        at = np.minimum(by_id.searchsorted(ids), len(by_id) - 1)
        found = by_id[at] == ids
        return found.nonzero()[0], order[at[found]], (~found).nonzero()[0].tolist()

    def _ahead_of(self, newer: StepPlan) -> np.ndarray:
        """Per running row, the tokens `newer` (scheduled, not applied) computes for it less
        the placeholders it counts for it (one output and its drafts where it emits)."""
        n = len(self.rids)
        extra = np.zeros(n, dtype=np.int64)
        m = len(newer.request_ids)
        if not m:
            return extra
        add = np.array(newer.num_new_tokens, dtype=np.int64)
        held = np.array(newer.emits_token, dtype=bool)
        if newer.num_spec_tokens:
            add -= np.where(held, 1 + np.array(newer.num_spec_tokens, dtype=np.int64), 0)
        else:
            add -= held
        mapped = self.plan_rows(newer.request_ids)
        if mapped is None:
            extra[:m] = add
        else:
            positions, rows, _ = mapped
            extra[rows] = add[positions]
        return extra

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

    def decodes_only(self) -> bool:
        """Every running sequence, as applied, is one token short of its known tokens and has
        emitted: its next step is a plain decode (async scheduling's runs read the columns,
        for apply_behind leaves _all_decode off while a plan is outstanding)."""
        n = len(self.reqs)
        state = self.state
        return bool((state[KNOWN, :n] - state[COMPUTED, :n] == 1).all()
                    and (state[DONE, :n] > 0).all())


def _credit(state: np.ndarray, idx: slice | list[int] | np.ndarray, emits: np.ndarray,
            new: np.ndarray, emitted: np.ndarray, drafting: np.ndarray) -> None:
    """Credit one applied step to the running columns `idx`, in place: a drafting sequence
    keeps what its scripted output has room for of the 1 + a_i tokens it emitted, and its
    rejected drafts roll back (computed = context + kept); every other one computed its
    new tokens and emitted at most one. Shared by the synchronous apply and the async
    apply of the step behind."""
    kept = np.minimum(emitted, state[TARGET, idx] - state[DONE, idx])
    out = np.where(drafting, kept, emits)
    state[COMPUTED, idx] += np.where(drafting, kept, new)
    state[KNOWN, idx] += out
    state[DONE, idx] += out
    state[DRAFTED, idx] += np.where(drafting, new - 1, 0)
    state[ACCEPTED, idx] += np.where(drafting, emitted - 1, 0)
    state[PREFILLING, idx] = ~emits
