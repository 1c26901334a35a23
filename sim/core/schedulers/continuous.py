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
step hits a prefix scheduled before it.

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
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers.batch_runs import apply_run, describe_run
from sim.core.schedulers.continuous_admission import ContinuousAdmission
from sim.core.schedulers.limits import LengthLimits
from sim.core.schedulers.plan_builder import PlanBuilder
from sim.core.schedulers.running_batch import RunningBatch
from sim.core.schedulers.speculation import Speculation


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
                 speculative_method: str = "ngram", cuda_graphs: bool = False) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs}) so every decode fits a step")
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
        self._swap_out_pending = 0  # slots swapped out, charged to the next plan built
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

    @property
    def speculative_tokens(self) -> int:
        """k: draft tokens proposed per decoding sequence per step (0 = no speculation)."""
        return self._spec.k

    @speculative_tokens.setter
    def speculative_tokens(self, k: int) -> None:
        self._spec.k = k

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
        """Now, after a step that only preempted (vLLM runs an empty step); else at an arrival.

        A lone request whose drafts outgrow the pool preempts itself; asked again, it
        is re-admitted and recomputes (emitting a token each time round, as in vLLM).
        """
        return now if self._preempted_only else None

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
                return None
        if req.state is RequestState.WAITING:
            self.waiting.remove(req)
        else:
            self._batch.remove(req)  # and from self.running, the list it shares
        self.kv.free(request_id)  # a swapped-out request's host blocks too
        req.abort(now)
        return req

    def schedule(self, now: float) -> StepPlan | None:
        """Running sequences in bulk (running_batch.py), then admissions one by one."""
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

    def decode_run(self, max_steps: int = 1 << 16) -> DecodeRun | None:
        """The next steps when they are plain decodes of the running set, else None.

        The running set must be all plain decodes within the budget, with no swap to
        charge and no speculation, and admission must stay shut for the whole run:
        an empty queue (the world ends the run at the next arrival; finishers just
        leave), or seats or budget full, or a head blocked on KV while no block
        frees (its need only grows: each step takes blocks, evictions only cost it
        hits), up to the first finisher's step.
        """
        batch, n = self._batch, len(self.running)
        if self._spec.k or not n or n > self.max_num_batched_tokens \
                or self._swap_out_pending or not batch.plain_decodes():
            return None
        waiting, blocked = self.waiting, self._blocked
        # with seats and budget left, only a KV-blocked head keeps admission shut
        on_kv = bool(waiting) and n < self.max_num_seqs and n < self.max_num_batched_tokens
        if on_kv and not (blocked is not None and blocked[0] is waiting[0]
                          and self.kv.num_free_blocks <= blocked[1]):
            return None
        return describe_run(batch, self.kv, self._paged is not None, self._padded_of,
                            len(waiting), on_kv, max_steps)

    def advance_decodes(self, run: DecodeRun, begin: int, end: int,
                        step_end_s: Sequence[float]) -> list[RunSegment]:
        """Apply steps [begin, end) (0 <= begin < end <= run.steps) of the last decode_run(),
        those before `begin` applied already; step s ended at `step_end_s[s]` (its
        finishers' finish time)."""
        assert 0 <= begin < end <= run.steps
        self.kv_blocked = run.kv_blocked
        return apply_run(self._batch, run, begin, end, step_end_s, self.kv,
                         self._paged is not None, self._paged if self._prefix_cache else None,
                         self._in_flight)

    def _build(self, step: PlanBuilder, preempted: list[int]) -> StepPlan | None:
        self._preempted_only = not step.size and bool(preempted)
        if not step.size:
            return None
        if self._swap_out_pending:
            step.swap_out_tokens, self._swap_out_pending = self._swap_out_pending, 0
        padded = 0
        if self._graph_sizes and not step.chunk_tokens and step.spec is None:
            padded = padded_batch_size(step.size, self._graph_sizes)
        return step.build(self._batch.rids, self._batch.tables, tuple(preempted), padded)

    def on_step_done(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        return self._batch.apply(plan, result, now, self.kv, self._in_flight)
