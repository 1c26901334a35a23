"""Iteration-level (continuous) batching over paged KV memory: vLLM v1's scheduler.

Its decisions are those of vLLM's own `vllm.v1.core.sched.scheduler.Scheduler`
at the release docs/vllm_parity.md names (FCFS policy, synchronous
scheduling), checked step by step by the parity suite (parity/, and
tests/test_vllm_parity.py against recorded traces). It also runs on a
contiguous pool, where each admission reserves prompt + maximum output up
front (see LengthLimits), so the two wins, iteration-level scheduling and
paging, can be measured apart.

One rule drives everything: each request's computed tokens catch up to its
known tokens (prompt + emitted output) under the step's token budget.
Running requests go first, in admission order; a prompt larger than what is
left of the budget is chunked (when chunked prefill is on); a request that
cannot get a block preempts the most recently admitted request, which
re-queues at the front: by recompute (drops its KV, re-prefills later) or,
servesim's own option with no vLLM v1 counterpart, by swap (its blocks move
to the host pool with their computed tokens and come back when it is
re-admitted; the bytes cost host-link time in the steps that move them; a
full host pool falls back to recompute). Waiting requests are admitted FCFS
only while no one was preempted this step, seats are free and the pool holds
blocks for all their known tokens (`scheduler_reserve_full_isl`, vLLM's
default; off, only the first chunk must fit, as in vLLM <= 0.18) above the
watermark.

With a prefix-caching pool an admission starting from zero computed tokens
reuses the longest cached prefix of its prompt and output (a request
preempted by recompute finds its own blocks) and computes only the rest;
blocks are named as they are allocated, so an admission later in the same
step hits a prefix scheduled before it. Blocks found in an offload tier below the
cache are loaded back as KVTransfers the world takes (`take_transfers`) and sends
on its links: a sync load's step waits for it; an async load's request waits
outside the running set until the world reports it landed (`kv_landed`).

The running set lives in numpy columns (running_columns.py; its pass of a step
is running_batch.py), whose cost per step barely grows with the batch and is
below a per-request loop's at every batch size; speculative decoding runs on
the same columns (speculation.py holds its rules), with k_i drafts per sequence.
Admission and preemption, the waiting queue's side, are continuous_admission.py;
runs of plain decodes, batch_runs.py. This module holds the scheduler's state,
its contract and the order of a step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from sim.core.batching import graph_batch_sizes, padded_batch_size
from sim.core.contiguous import ContiguousAllocator
from sim.core.decode_run import DecodeRun, RunSegment
from sim.core.kv import KVManager, PagedBlockManager
from sim.core.kv_transfer import KVTransfer
from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request, RequestState
from sim.core.schedulers.batch_runs import apply_run, apply_run_ahead, describe_run
from sim.core.schedulers.continuous_admission import ContinuousAdmission
from sim.core.schedulers.limits import LengthLimits
from sim.core.schedulers.plan_builder import PlanBuilder
from sim.core.schedulers.running_batch import RunningBatch
from sim.core.schedulers.running_columns import COMPUTED
from sim.core.schedulers.speculation import Speculation, async_scheduling_problem


class ContinuousScheduler(ContinuousAdmission):
    """`max_output_tokens` caps outputs (longer ones are rejected) and, on a contiguous
    pool, sizes reservations with max_model_len (one of them is then required).
    `preemption`: "recompute" or "swap" (swap needs a paged pool with a host pool).
    `scheduler_reserve_full_isl`: vLLM's setting of that name (see the module doc).
    `speculative_tokens` / `speculative_method`: see speculation.py.
    `cuda_graphs`: a decode-only step's `padded_batch` is the next CUDA-graph batch size
    (sim.core.batching), the batch the engine runs.
    """

    def __init__(self, kv: KVManager, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, chunked_prefill: bool = True,
                 max_model_len: int | None = None,
                 max_output_tokens: int | None = None, preemption: str = "recompute",
                 speculative_tokens: int = 0, scheduler_reserve_full_isl: bool = True,
                 speculative_method: str = "ngram", cuda_graphs: bool = False,
                 async_scheduling: bool = False) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs}) so every decode fits a step")
        if preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be 'recompute' or 'swap', got {preemption!r}")
        if preemption == "swap" and not isinstance(kv, PagedBlockManager):
            raise ValueError("swap preemption needs a paged KV pool")
        if async_scheduling:
            problem = async_scheduling_problem(preemption, speculative_tokens,
                                               speculative_method)
            if problem is not None:
                raise ValueError(f"async_scheduling: {problem}")
        self.limits = LengthLimits(max_model_len, max_output_tokens)
        if isinstance(kv, ContiguousAllocator) and not self.limits.bounded:
            raise ValueError("a contiguous KV pool needs max_model_len or max_output_tokens "
                             "to size each request's reservation")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.max_model_len = max_model_len
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is the next victim
        # admitted and not finished, by id (a waiting request costs no entry: at overload
        # the queue holds most of a run's requests)
        self._in_flight: dict[int, Request] = {}
        self.preemption = preemption
        self._swap = preemption == "swap"
        # the pool's swap and naming calls, which only the paged pool has
        self._paged = kv if isinstance(kv, PagedBlockManager) else None
        self._prefix_cache = kv.enable_prefix_cache
        # swap-outs (host-link KVTransfers) not yet charged to a plan: the next one built
        self._swap_out_pending: list[KVTransfer] = []
        self.num_recomputed_tokens = 0  # computed tokens dropped by recompute preemption
        self.num_swap_fallbacks = 0  # swap preemptions that found the host pool full
        # read-only: the last admission stopped for lack of KV blocks (TTFT diagnosis)
        self.kv_blocked = False
        # the waiting head the last admission stopped at for lack of blocks, and the free
        # blocks then: while it heads the queue and no block frees, it stays blocked
        self._blocked: tuple[Request, int] | None = None
        self._preempted_only = False  # the last schedule() preempted and ran nothing
        self._spec = Speculation(speculative_tokens, speculative_method, max_model_len)
        # the running set's counters, in admission order (shares self.running)
        self._batch = RunningBatch(self.running, kv, self._spec)
        # CUDA graphs: a decode-only step runs padded to the next captured batch size
        self._graph_sizes = graph_batch_sizes(max_num_seqs) if cuda_graphs else ()
        # the batch n plain decodes run as, by n (describe_run's segments look it up)
        self._padded_of = tuple(padded_batch_size(n, self._graph_sizes) if n and cuda_graphs
                                else n for n in range(max_num_seqs + 1))
        self._async = async_scheduling
        # async scheduling: plans scheduled and not yet applied, oldest first (at most two:
        # one runs while the next is scheduled), and the requests preempted while one of
        # them ran, whose outputs it still delivers (vLLM's stale output)
        self._outstanding: deque[StepPlan] = deque()
        self._stale: dict[int, Request] = {}
        # asynchronous offload-tier loads (sim.core.offload_tier): requests whose blocks are
        # loading, outside the running set, by id, with how many of their loads are still
        # in flight (the world reports each landing: kv_landed)
        self._loading: dict[int, tuple[Request, int]] = {}
        # KV moves issued and not yet taken by the world (take_transfers)
        self._moves: list[KVTransfer] = []

    @property
    def speculative_tokens(self) -> int:
        """k: draft tokens proposed per decoding sequence per step (0 = no speculation)."""
        return self._spec.k

    @speculative_tokens.setter
    def speculative_tokens(self, k: int) -> None:
        self._spec.k = k

    @property
    def async_scheduling(self) -> bool:
        """vLLM's async scheduling: schedule() may be called while the last plan still runs."""
        return self._async

    @property
    def speculative_method(self) -> str:
        """vLLM's speculative method, which sets the budget and KV rules (SPECULATIVE_METHODS)."""
        return self._spec.method

    @speculative_method.setter
    def speculative_method(self, method: str) -> None:
        self._spec.method = method

    # -- queries -------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self._loading)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.num_used_blocks

    @property
    def kv_slots_held(self) -> int:
        """Token slots allocated (paged) or reserved (contiguous) right now."""
        return self.kv.num_used_blocks * self.kv.block_size

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._loading)

    def next_wakeup(self, now: float) -> float | None:
        """Now, after a step that only preempted (vLLM runs an empty step); else at an arrival.

        A lone request whose drafts outgrow the pool preempts itself; asked again, it
        is re-admitted and recomputes (emitting a token each time round, as in vLLM).
        An async tier load lands when the world says (kv_landed), not at a time of ours.
        """
        if self._preempted_only:
            return now
        return None  # a tier load's landing wakes the world's replica itself

    def close(self, now: float) -> None:
        """No more arrivals: nothing changes, every step already admits what waits."""

    # -- contract ------------------------------------------------------------
    def add(self, request: Request, now: float) -> bool:
        reason = self._never_fits(request)
        if reason is not None:
            request.reject(reason, now)
            return False
        self.waiting.append(request)
        return True

    def abort(self, request_id: int, now: float) -> Request | None:
        """Drop a waiting or running request between steps and free its KV (see Scheduler)."""
        req = self._in_flight.pop(request_id, None)
        if req is None:  # never admitted (waiting), or gone already
            req = next((r for r in self.waiting if r.request_id == request_id), None)
            if req is None:
                return self._abort_loading(request_id, now)
        self._stale.pop(request_id, None)
        if req.state is RequestState.WAITING:
            self.waiting.remove(req)
        else:
            self._batch.remove(req)  # and from self.running, the list it shares
        self.kv.free(request_id)  # a swapped-out request's host blocks too
        req.abort(now)
        return req

    def schedule(self, now: float) -> StepPlan | None:
        """Running sequences in bulk (running_batch.py), then admissions one by one.

        With async scheduling the plan may be asked for while the last one still runs
        (its on_step_done not called yet): then it is scheduled ahead (_schedule_ahead).
        """
        if self._async:
            if self._outstanding:
                return self._schedule_ahead(now)
            plan = self._schedule_now(now)
            if plan is not None:
                self._outstanding.append(plan)
            return plan
        return self._schedule_now(now)

    def _schedule_now(self, now: float) -> StepPlan | None:
        """The step when nothing runs: the synchronous scheduler's."""
        batch, kv = self._batch, self.kv
        step = PlanBuilder()
        preempted: list[int] = []
        self._blocked = None
        budget = batch.schedule_running(self.max_num_batched_tokens, kv, step, self._preempt,
                                        preempted, self._paged if self._prefix_cache else None)
        if not preempted:
            self._admit(budget, step, now, step.size > 0, batch.prefill_scheduled)
        plan = batch.pending = self._build(step, preempted)
        return plan

    def _schedule_ahead(self, now: float) -> StepPlan | None:
        """The next step while the outstanding one runs: vLLM's AsyncScheduler.

        The running pass counts the outstanding step as done, all its drafts accepted
        (running_batch.py, schedule_running_ahead); admission is the same. A request
        preempted now still gets the outstanding step's outputs when it is applied
        (vLLM's stale output); vLLM would not re-admit it before that, which here can
        never arise: a step that preempts admits no one, and the outstanding step is
        applied before the next schedule().
        """
        outstanding = self._outstanding
        if len(outstanding) > 1:
            raise RuntimeError("schedule() with two plans outstanding: async scheduling runs "
                               "one step ahead; apply the oldest first (on_step_done)")
        batch = self._batch
        step = PlanBuilder()
        preempted: list[int] = []
        self._blocked = None
        ahead = outstanding[0]
        budget = batch.schedule_running_ahead(self.max_num_batched_tokens, self.kv, step,
                                              self._preempt, preempted,
                                              self._paged if self._prefix_cache else None,
                                              ahead, self.max_model_len)
        start = len(self.running)
        if not preempted:
            self._admit(budget, step, now, step.size > 0, batch.prefill_scheduled)
        rows = batch.rows
        batch.rows = None
        assert rows is not None
        rows += range(start, len(self.running))
        plan = self._build_rows(step, preempted, rows)
        if plan is not None:
            outstanding.append(plan)
        return plan

    def _build_rows(self, step: PlanBuilder, preempted: list[int], rows: list[int]
                    ) -> StepPlan | None:
        """_build for a step of these running rows (not all of the first ones)."""
        self._preempted_only = not step.size and bool(preempted)
        if not step.size:
            return None
        padded = 0
        if self._graph_sizes and not step.chunk_tokens and step.spec is None:
            padded = padded_batch_size(step.size, self._graph_sizes)
        rids, tables = self._batch.rids, self._batch.tables
        return step.build([rids[i] for i in rows], [tables[i] for i in rows], tuple(preempted),
                          padded)

    def decode_run(self, max_steps: int = 1 << 16) -> DecodeRun | None:
        """The next steps when they are plain decodes of the running set, else None.

        The running set must be all plain decodes within the budget, with no swap to
        charge and no speculation, and admission must stay shut for the whole run:
        an empty queue (the world ends the run at the next arrival; finishers just
        leave), or seats or budget full, or a head blocked on KV while no block
        frees (its need only grows: each step takes blocks, evictions only cost it
        hits), up to the first finisher's step.

        With async scheduling (`_decode_run_ahead`) a run starts with the one plan
        outstanding, and none without one.
        """
        batch, n = self._batch, len(self.running)
        if self._loading or self._moves:  # KV in flight lands when the world says: step by step
            return None
        if self._async:
            return self._decode_run_ahead(max_steps) if len(self._outstanding) == 1 else None
        if self._outstanding or self._spec.k or not n or n > self.max_num_batched_tokens \
                or self._swap_out_pending or not batch.plain_decodes():
            return None
        on_kv = self._admission_on_kv()
        if on_kv is None:
            return None
        return describe_run(batch, self.kv, self._paged is not None, self._padded_of,
                            len(self.waiting), on_kv, max_steps)

    def _admission_on_kv(self) -> bool | None:
        """Whether admission is shut by a KV-blocked head (else by an empty queue, seats or
        budget); None when it may open."""
        n, waiting, blocked = len(self.running), self.waiting, self._blocked
        # with seats and budget left, only a KV-blocked head keeps admission shut
        on_kv = bool(waiting) and n < self.max_num_seqs and n < self.max_num_batched_tokens
        if on_kv and not (blocked is not None and blocked[0] is waiting[0]
                          and self.kv.num_free_blocks <= blocked[1]):
            return None
        return on_kv

    def _decode_run_ahead(self, max_steps: int) -> DecodeRun | None:
        """decode_run under async scheduling, while `plan`, the one outstanding, runs: its
        step 0 is that plan, which must be one plain decode of every running sequence, each
        a plain decode in the columns (the steps before it applied), with admission shut as
        in decode_run and the last admission's kv_blocked what the run's steps keep. The run
        is the synchronous description less its last step: the plan of the step after the
        run's last is made during it (it takes its blocks, which the description's pool
        check covers, and it must not admit), and is left outstanding at its end."""
        batch, n = self._batch, len(self.running)
        plan = self._outstanding[0]
        if self._spec.k or not n or n > self.max_num_batched_tokens or self._stale \
                or plan.preempted_ids or plan.shape.num_decodes != n \
                or plan.shape.prefill_chunk_tokens or plan.request_ids != tuple(batch.rids) \
                or not batch.decodes_only():
            return None
        on_kv = self._admission_on_kv()
        if on_kv is None or on_kv != self.kv_blocked:
            return None
        run = describe_run(batch, self.kv, self._paged is not None, self._padded_of,
                           len(self.waiting), on_kv, max_steps + 1)
        if run is None or run.steps < 3 or run.shape != plan.shape:
            return None
        steps = run.steps - 1
        return run._replace(steps=steps, segments=tuple(s for s in run.segments if s[0] < steps))

    def ahead_plan(self) -> StepPlan | None:
        """Async scheduling: the plan outstanding (made while the last step ran), if any."""
        return self._outstanding[0] if self._outstanding else None

    def advance_decodes(self, run: DecodeRun, begin: int, end: int,
                        step_end_s: Sequence[float]) -> list[RunSegment]:
        """Apply steps [begin, end) (0 <= begin < end <= run.steps) of the last decode_run(),
        those before `begin` applied already; step s ended at `step_end_s[s]` (its
        finishers' finish time)."""
        assert 0 <= begin < end <= run.steps
        self.kv_blocked = run.kv_blocked
        if not self._async:
            return apply_run(self._batch, run, begin, end, step_end_s, self.kv,
                             self._paged is not None, self._paged if self._prefix_cache else None,
                             self._in_flight)
        ran = apply_run_ahead(self._batch, run, begin, end, step_end_s, self.kv,
                              self._paged is not None,
                              self._paged if self._prefix_cache else None, self._in_flight)
        if end == run.steps:  # the plan made during the last step: outstanding now
            self._outstanding[0] = self._decode_plan()
        return ran

    def _decode_plan(self) -> StepPlan:
        """The plan _schedule_ahead makes of a running set of plain decodes, none skipped
        (a decode run's next plan under async scheduling)."""
        batch = self._batch
        n = len(batch.rids)
        contexts = batch.state[COMPUTED, :n].tolist()
        return StepPlan(tuple(batch.rids), (1,) * n, tuple(contexts), tuple(batch.tables),
                        (False,) * n, (True,) * n,
                        StepShape((), (), n, sum(contexts), max(contexts), self._padded_of[n]))

    def _build(self, step: PlanBuilder, preempted: list[int]) -> StepPlan | None:
        self._preempted_only = not step.size and bool(preempted)
        if not step.size:
            return None
        if self._swap_out_pending:  # the step carries them: the world sends them with it
            swapped = self._swap_out_pending
            step.swap_out_tokens = sum(t.num_blocks for t in swapped) * self.kv.block_size
            self._moves[:0], self._swap_out_pending = swapped, []
        padded = 0
        if self._graph_sizes and not step.chunk_tokens and step.spec is None:
            padded = padded_batch_size(step.size, self._graph_sizes)
        return step.build(self._batch.rids, self._batch.tables, tuple(preempted), padded)

    def on_step_done(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply a finished step; with async scheduling, the oldest outstanding plan."""
        if self._async:
            return self._apply_oldest(plan, result, now)
        return self._batch.apply(plan, result, now, self.kv, self._in_flight)

    def _apply_oldest(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """vLLM's update_from_output under async scheduling (running_columns.apply_behind),
        and the outputs of requests preempted while the plan ran: vLLM delivers them (they
        count as output, may finish the request) but they change nothing else."""
        outstanding = self._outstanding
        if not outstanding or plan is not outstanding[0]:
            raise ValueError("on_step_done: with async scheduling steps are applied in the "
                             "order they were scheduled; this is not the oldest outstanding plan")
        outstanding.popleft()
        finished, gone, counts = self._batch.apply_behind(
            plan, result, now, self.kv, self._in_flight, outstanding[0] if outstanding else None,
            self._paged if self._prefix_cache else None)
        if not gone or not self._stale:
            return finished
        ended = []
        for j in gone:
            req = self._stale.pop(plan.request_ids[j], None)
            if req is None or not counts[j]:  # finished or aborted already; a chunk
                continue
            done = req.num_output_done
            done += min(int(counts[j]), req.output_tokens - done)
            req.num_output_done = done
            if req.first_token_s is None:
                req.first_token_s = now
            if done == req.output_tokens:
                self.waiting.remove(req)
                req.state = RequestState.FINISHED
                req.finish_s = now
                del self._in_flight[req.request_id]
                self.kv.free(req.request_id)  # its blocks went at the preemption
                ended.append(req)
        if not ended:
            return finished
        order = {rid: j for j, rid in enumerate(plan.request_ids)}
        return sorted(finished + ended, key=lambda r: order[r.request_id])
