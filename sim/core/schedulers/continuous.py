"""Iteration-level (continuous) batching over paged KV memory, vLLM v1 style.

It runs on either KV pool: paged (the default) or contiguous, where each
admission reserves prompt + maximum output up front (see LengthLimits), so
the two wins, iteration-level scheduling and paging, can be measured apart.

One rule drives everything: each request's computed tokens catch up to its
known tokens (prompt + emitted output) under the step's token budget.
Running requests go first, in admission order; a prompt larger than what is
left of the budget is chunked (when chunked prefill is on); a request that
cannot get a block preempts the most recently admitted request, which
re-queues at the front: by recompute (drops its KV, re-prefills later) or by
swap (its blocks move to the host pool with their computed tokens and come
back when it is re-admitted; the bytes cost host-link time in the steps that
move them; a full host pool falls back to recompute). Waiting requests are
admitted FCFS only while no one was preempted this step and blocks are free.

With a prefix-caching pool, an admission starting from zero computed tokens
reuses the longest cached prefix of its prompt and computes only the rest;
after each step the prompt blocks it filled are named for later requests.

Two implementations of that rule give identical plans: a per-request path for
small batches (cheapest there), and an array path (running_batch.py) whose
cost per step barely grows with the batch; the scheduler switches between them
with hysteresis on the running-set size.

Speculative decoding (`speculative_tokens` = k > 0; the contract is in
sim/core/plan.py): each decoding sequence is scheduled 1 + k_i tokens, k_i =
min(k, output tokens still to emit - 1, token budget left - 1), with KV slots
for all of them; on_step_done reads how many each emitted from
`StepResult.num_emitted` and rolls the rejected drafts back (computed = context
+ emitted). The slots of rejected drafts stay in the table, as in vLLM: the
next step writes its own 1 + k tokens there (a table never holds more than
blocks_for(computed + k)), and every block is freed when the request finishes
or is preempted. Speculation runs on the per-request path only: the array path
assumes one token per decode; with k = 0 nothing changes.
"""

from __future__ import annotations

from collections import deque

from sim.core.batching import graph_batch_sizes, padded_batch_size
from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import KVManager, PagedBlockManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers.limits import LengthLimits
from sim.core.schedulers.plan_builder import PlanBuilder
from sim.core.schedulers.running_batch import RunningBatch


class ContinuousScheduler:
    """`vectorize_at`: running-set size from which the array path is used (back below half).

    `max_output_tokens` caps outputs (longer ones are rejected) and, on a contiguous
    pool, sizes reservations with max_model_len (one of them is then required).
    `preemption`: "recompute" or "swap" (swap needs a paged pool with a host pool).
    `cuda_graphs`: a decode-only step's `padded_batch` is the next CUDA-graph batch size
    (sim.core.batching), the batch the engine runs.
    """

    def __init__(self, kv: KVManager, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, chunked_prefill: bool = True,
                 max_model_len: int | None = None, vectorize_at: int = 24,
                 max_output_tokens: int | None = None, preemption: str = "recompute",
                 speculative_tokens: int = 0, cuda_graphs: bool = False) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs}) so every decode fits a step")
        if vectorize_at < 1:
            raise ValueError(f"vectorize_at must be >= 1, got {vectorize_at}")
        if preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be 'recompute' or 'swap', got {preemption!r}")
        if preemption == "swap" and not isinstance(kv, PagedBlockManager):
            raise ValueError("swap preemption needs a paged KV pool")
        self.limits = LengthLimits(max_model_len, max_output_tokens)
        if isinstance(kv, ContiguousAllocator) and not self.limits.bounded:
            raise ValueError("a contiguous KV pool needs max_model_len or max_output_tokens "
                             "to size each request's reservation")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.max_model_len = max_model_len
        self.vectorize_at = vectorize_at
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the last is the next victim
        self._in_flight: dict[int, Request] = {}
        self._batch: RunningBatch | None = None  # set while the array path owns the counters
        self.preemption = preemption
        self._swap = preemption == "swap"
        # the pool's swap and naming calls, which only the paged pool has
        self._paged = kv if isinstance(kv, PagedBlockManager) else None
        self._prefix_cache = kv.enable_prefix_cache
        self._swap_out_pending = 0  # slots swapped out, charged to the next plan built
        self.num_recomputed_tokens = 0  # computed tokens dropped by recompute preemption
        self.num_swap_fallbacks = 0  # swap preemptions that found the host pool full
        # read-only: the last admission stopped for lack of KV blocks (TTFT diagnosis)
        self.kv_blocked = False
        self.speculative_tokens = speculative_tokens
        # CUDA graphs: a decode-only step runs padded to the next captured batch size
        self._graph_sizes = graph_batch_sizes(max_num_seqs) if cuda_graphs else ()

    @property
    def speculative_tokens(self) -> int:
        """k: draft tokens proposed per decoding sequence per step (0 = no speculation)."""
        return self._spec_k

    @speculative_tokens.setter
    def speculative_tokens(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"speculative_tokens must be an integer >= 0, got {k!r}")
        self._spec_k = k

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

    @property
    def kv_slots_held(self) -> int:
        """Token slots allocated (paged) or reserved (contiguous) right now."""
        return self.kv.num_used_blocks * self.kv.block_size

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def next_wakeup(self, now: float) -> float | None:
        return None

    def close(self, now: float) -> None:
        """No more arrivals: nothing changes, every step already admits what waits."""

    def sync_requests(self) -> None:
        """Make running requests' `num_computed_tokens`/`num_output_done` exact (see Request)."""
        if self._batch is not None:
            self._batch.sync()

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
        reason = self.limits.never_fits(request, self.kv)
        if reason is not None:
            return reason
        if not self.chunked_prefill and request.prompt_tokens > self.max_num_batched_tokens:
            return (f"prompt {request.prompt_tokens} > max_num_batched_tokens "
                    f"{self.max_num_batched_tokens} with chunked prefill off")
        return None

    def schedule(self, now: float) -> StepPlan | None:
        batch, n = self._batch, len(self.running)
        if self._spec_k:  # speculation runs on the per-request path only
            if batch is not None:
                batch.sync()
                batch.pending = None
                self._batch = None
            return self._schedule_each(now)
        if batch is None:
            if n >= self.vectorize_at:
                self._batch = RunningBatch(self.running, self.kv)
                return self._schedule_batch(now)
            return self._schedule_each(now)
        if n < self.vectorize_at // 2:
            batch.sync()
            self._batch = None
            return self._schedule_each(now)
        return self._schedule_batch(now)

    def _schedule_batch(self, now: float) -> StepPlan | None:
        """The array path: running sequences in bulk, then admissions one by one."""
        batch, kv = self._batch, self.kv
        assert batch is not None
        step = PlanBuilder()
        preempted: list[int] = []
        budget = batch.schedule_running(self.max_num_batched_tokens, kv, step, self._preempt,
                                        preempted)
        if not preempted:
            self._admit(budget, step, now)
        if not step.request_ids:
            batch.pending = None
            return None
        plan = batch.pending = self._build(step, preempted)
        return plan

    def _schedule_each(self, now: float) -> StepPlan | None:
        """The per-request path: Request objects hold exact counters."""
        kv, running = self.kv, self.running
        budget = self.max_num_batched_tokens
        step = PlanBuilder()
        preempted: list[int] = []

        spec_k = self._spec_k
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            new = min(req.prompt_tokens + req.num_output_done - computed, budget)
            spec = 0
            if spec_k and req.num_output_done and computed == req.num_known_tokens - 1:
                # a decode: its last token plus k_i drafts, never past its scripted output
                spec = min(spec_k, req.output_tokens - req.num_output_done - 1, budget - 1)
                new += spec
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
            step.add(req, new, table, spec)
            budget -= new
            i += 1

        if not preempted:
            self._admit(budget, step, now)
        if not step.request_ids:
            return None
        return self._build(step, preempted)

    def _build(self, step: PlanBuilder, preempted: list[int]) -> StepPlan:
        if self._swap_out_pending:
            step.swap_out_tokens, self._swap_out_pending = self._swap_out_pending, 0
        padded = 0
        if self._graph_sizes and not step.chunk_tokens and step.spec is None:
            padded = padded_batch_size(len(step.request_ids), self._graph_sizes)
        return step.build(tuple(preempted), padded)

    def _admit(self, budget: int, step: PlanBuilder, now: float) -> None:
        """Admit waiting requests FCFS while budget, seats and blocks last."""
        self.kv_blocked = False
        kv, waiting, running, batch = self.kv, self.waiting, self.running, self._batch
        reserve_tokens, prefix_cache = self.limits.reserve_tokens, self._prefix_cache
        paged = self._paged if self._swap else None
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting[0]
            computed = req.num_computed_tokens
            swapped = paged is not None and paged.is_swapped(req.request_id)
            if prefix_cache and not computed:
                computed = kv.cached_prefix_tokens(req)
            new = req.num_known_tokens - computed
            if new > budget:
                # without chunking a prefill waits for a step with room, unless it can
                # never have room (a recompute longer than the whole budget): chunk it
                if not self.chunked_prefill and new <= self.max_num_batched_tokens:
                    break
                new = budget
            if swapped:
                assert paged is not None
                moved = paged.swap_in(req.request_id, computed + new, bool(running))
                if moved < 0:
                    self.kv_blocked = True
                    break
                step.swap_in_tokens += moved * kv.block_size
            else:
                hits = kv.allocate(req.request_id, computed + new, use_watermark=bool(running),
                                   reserve_tokens=reserve_tokens(req),
                                   request=req if prefix_cache else None)
                if hits < 0:
                    self.kv_blocked = True
                    break
                if hits:  # only from zero computed tokens: the lookup above saw the same
                    req.num_computed_tokens = hits
            if req.first_scheduled_s is None:
                req.prefix_hit_tokens = req.num_computed_tokens
            waiting.popleft()
            running.append(req)
            req.state = RequestState.RUNNING
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
            table = kv.block_table(req.request_id)
            if batch is not None:
                batch.admitted(req, table, new)
            step.add(req, new, table)
            budget -= new

    def _preempt(self, req: Request) -> None:
        """Re-queue `req` at the front; its counters must be exact (the batch syncs them)."""
        req.num_preemptions += 1
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)
        if self._swap and self._paged is not None:
            moved = self._paged.swap_out(req.request_id)
            if moved >= 0:
                self._swap_out_pending += moved * self.kv.block_size
                return
            self.num_swap_fallbacks += 1
        self.kv.free(req.request_id)
        self.num_recomputed_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0

    def on_step_done(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        if self._prefix_cache and plan.shape.prefill_chunk_tokens:
            self._name_computed(plan)  # before finished requests free their blocks
        batch = self._batch
        if batch is not None:
            if plan is batch.pending:
                return batch.apply(now, self.kv, self._in_flight)
            batch.sync()  # not the plan just scheduled: apply it the per-request way
            batch.pending = None
            self._batch = None
        in_flight = self._in_flight
        finished: list[Request] = []
        if plan.num_spec_tokens or result.num_emitted:
            self._apply_speculative(plan, result, now, finished)
        else:
            for rid, new, emits in zip(plan.request_ids, plan.num_new_tokens, plan.emits_token,
                                       strict=True):
                req = in_flight[rid]
                if req.advance(new, emits, now):
                    self.kv.free(rid)
                    del in_flight[rid]
                    finished.append(req)
        if finished:
            self.running[:] = [r for r in self.running if r.state is RequestState.RUNNING]
        return finished

    def _apply_speculative(self, plan: StepPlan, result: StepResult, now: float,
                           finished: list[Request]) -> None:
        """on_step_done for a plan with drafts: each emitting sequence emitted num_emitted[j]."""
        emitted = result.num_emitted
        num_emitting = plan.num_emitting
        if emitted and len(emitted) != num_emitting:
            raise ValueError(f"StepResult.num_emitted has {len(emitted)} entries for "
                             f"{num_emitting} emitting sequences")
        spec = plan.num_spec_tokens or (0,) * plan.batch_size
        in_flight, j = self._in_flight, 0
        for rid, new, emits, k in zip(plan.request_ids, plan.num_new_tokens, plan.emits_token,
                                      spec, strict=True):
            req = in_flight[rid]
            count = 1
            if emits and emitted:
                count = emitted[j]
                j += 1
            if k:
                done = req.advance_speculative(new, count, now)
            elif count != 1:
                raise ValueError(f"request {rid}: emitted {count} tokens from a step with no "
                                 "draft tokens")
            else:
                done = req.advance(new, emits, now)
            if done:
                self.kv.free(rid)
                del in_flight[rid]
                finished.append(req)

    def _name_computed(self, plan: StepPlan) -> None:
        """Name the prompt blocks this step's prefills filled, so later requests can hit them."""
        assert self._paged is not None
        cache = self._paged.cache_computed
        for rid, context, new, prefill in zip(plan.request_ids, plan.context_tokens,
                                              plan.num_new_tokens, plan.is_prefill, strict=True):
            if prefill:
                cache(rid, context + new)
