"""Iteration-level (continuous) batching over paged KV memory, vLLM v1 style.

One rule drives everything: each request's computed tokens catch up to its
known tokens (prompt + emitted output) under the step's token budget.
Running requests go first, in admission order; a prompt larger than what is
left of the budget is chunked (when chunked prefill is on); a request that
cannot get a block preempts the most recently admitted request, which drops
its KV and re-queues at the front (recompute). Waiting requests are admitted
FCFS only while no one was preempted this step and blocks are free.
"""

from __future__ import annotations

from collections import deque

from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request, RequestState


class ContinuousScheduler:
    def __init__(self, kv: PagedBlockManager, max_num_seqs: int = 256,
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
        scheduled: list[tuple[Request, int]] = []
        preempted: list[int] = []

        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            new = min(req.num_known_tokens - req.num_computed_tokens, budget)
            while not kv.append_slots(req.request_id, req.num_computed_tokens + new):
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled.append((req, new))
                budget -= new
                i += 1
                continue
            break  # the request preempted itself: everyone after it is gone too

        if not preempted:
            self._admit(budget, scheduled, now)
        if not scheduled:
            return None
        return self._build_plan(scheduled, tuple(preempted))

    def _admit(self, budget: int, scheduled: list[tuple[Request, int]], now: float) -> None:
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
            scheduled.append((req, new))
            budget -= new

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)

    def _build_plan(self, scheduled: list[tuple[Request, int]],
                    preempted: tuple[int, ...]) -> StepPlan:
        table = self.kv.block_table
        ids, news, contexts, tables, prefills, emits = [], [], [], [], [], []
        chunk_tokens, chunk_contexts = [], []
        num_decodes = decode_sum = decode_max = 0
        for req, new in scheduled:
            computed = req.num_computed_tokens
            known = req.num_known_tokens
            is_decode = new == 1 and computed == known - 1 and req.num_output_done > 0
            ids.append(req.request_id)
            news.append(new)
            contexts.append(computed)
            tables.append(table(req.request_id))
            prefills.append(not is_decode)
            emits.append(computed + new == known)
            if is_decode:
                num_decodes += 1
                decode_sum += computed
                if computed > decode_max:
                    decode_max = computed
            else:
                chunk_tokens.append(new)
                chunk_contexts.append(computed)
        shape = StepShape(tuple(chunk_tokens), tuple(chunk_contexts), num_decodes,
                          decode_sum, decode_max, len(ids))
        return StepPlan(tuple(ids), tuple(news), tuple(contexts), tuple(tables),
                        tuple(prefills), tuple(emits), shape, preempted)

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
