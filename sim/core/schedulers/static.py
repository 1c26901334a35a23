"""Static batching: request-level batches of a fixed size B, the baseline that wastes slots.

A batch launches when B requests wait, when arrivals are exhausted (close()),
or, if `max_wait_s` is set, when the oldest has waited that long. It runs to
completion (see RequestBatch): padded to B slots, nothing joins, and the next
batch launches only when its longest member has finished. KV memory is
contiguous: each member reserves prompt + maximum output at launch and keeps
it until the batch ends, as servers before paging did. After its prefill a batch's
decode steps are one decode run for the world to fast-forward (decode_run,
advance_decodes): arrivals only wait for the next batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import ClassVar

from sim.core.contiguous import ContiguousAllocator
from sim.core.decode_run import DecodeRun, FinishStep, RunSegment, decode_shape
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request, RequestState
from sim.core.schedulers.limits import LengthLimits
from sim.core.schedulers.request_batch import RequestBatch

SCRIPTED = StepResult()  # a request-level batch's decodes emit one token each


class StaticScheduler:
    """`max_model_len` and/or `max_output_tokens` size the reservations (see LengthLimits)."""

    pads_to_batch_size: ClassVar[bool] = True  # a short batch still runs over B slots
    launches_on_close: ClassVar[bool] = True  # the end of arrivals launches a short batch
    speculative_tokens: ClassVar[int] = 0  # request-level batching never speculates
    num_recomputed_tokens: ClassVar[int] = 0  # nor preempts: a batch runs to completion

    def __init__(self, kv: ContiguousAllocator, batch_size: int = 16,
                 max_wait_s: float | None = None, max_model_len: int | None = None,
                 max_output_tokens: int | None = None, pad_prompts: bool = True) -> None:
        if not isinstance(kv, ContiguousAllocator):
            raise TypeError(f"{type(self).__name__} reserves KV up front: it needs a "
                            f"ContiguousAllocator, got {type(kv).__name__}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_wait_s is not None and not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s!r}")
        self.limits = LengthLimits(max_model_len, max_output_tokens)
        if not self.limits.bounded:
            raise ValueError("max_model_len or max_output_tokens is needed to size each "
                             "request's KV reservation")
        self.kv = kv
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.pad_prompts = pad_prompts
        self.waiting: deque[Request] = deque()
        self.batch: RequestBatch | None = None
        self.closed = False
        # read-only: the running batch launched short on a full pool while requests waited
        self.kv_blocked = False

    # -- queries -------------------------------------------------------------
    @property
    def async_scheduling(self) -> bool:
        """Request-level batching has no async mode: a batch is applied before the next."""
        return False

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        """Live members of the running batch (finished ones only pad it)."""
        return 0 if self.batch is None else self.batch.num_live

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.num_used_blocks

    @property
    def kv_slots_held(self) -> int:
        """Token slots reserved now, by live and finished members alike."""
        return self.kv.num_used_blocks * self.kv.block_size

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or self.batch is not None

    def next_wakeup(self, now: float) -> float | None:
        """The oldest waiter's deadline, when a max wait is set and no batch runs."""
        if self.batch is not None or not self.waiting or self.max_wait_s is None:
            return None
        return self.waiting[0].arrival_s + self.max_wait_s

    # -- contract ------------------------------------------------------------
    def add(self, request: Request, now: float) -> bool:
        reason = self.limits.never_fits(request, self.kv)
        if reason is not None:
            request.reject(reason, now)
            return False
        self.waiting.append(request)
        return True

    def close(self, now: float) -> None:
        self.closed = True

    def abort(self, request_id: int, now: float) -> Request | None:
        """Drop a waiting request, or a live member of the running batch, and free its KV.

        An aborted member leaves the batch's decodes at once (its slot pads the batch, as
        a finished member's does); a batch with no live member left ends there.
        """
        req = next((r for r in self.waiting if r.request_id == request_id), None)
        if req is not None:
            self.waiting.remove(req)
        elif self.batch is not None and (req := self.batch.abort(request_id)) is not None:
            self.kv.free(request_id)
            if self.batch.done:
                self._end_batch()
        else:
            return None
        req.abort(now)
        return req

    def schedule(self, now: float) -> StepPlan | None:
        if self.batch is None:
            if not self._ready(now):
                return None
            self.batch = self._launch(now)
        return self.batch.plan(self.kv)

    def _ready(self, now: float) -> bool:
        waiting = self.waiting
        if not waiting:
            return False
        if len(waiting) >= self.batch_size or (self.closed and self.launches_on_close):
            return True
        return self.max_wait_s is not None and now >= waiting[0].arrival_s + self.max_wait_s

    def _launch(self, now: float) -> RequestBatch:
        """Reserve KV for up to B waiters, FCFS; the pool is empty, so the first always fits."""
        kv, waiting, reserve_tokens = self.kv, self.waiting, self.limits.reserve_tokens
        members: list[Request] = []
        while waiting and len(members) < self.batch_size:
            req = waiting[0]
            # no watermark: reservations never grow, so there is no growth to keep room for
            if kv.allocate(req.request_id, req.prompt_tokens, use_watermark=False,
                           reserve_tokens=reserve_tokens(req)) < 0:
                break  # the pool is full: the batch runs short
            waiting.popleft()
            req.state = RequestState.RUNNING
            req.first_scheduled_s = now
            members.append(req)
        self.kv_blocked = bool(waiting) and len(members) < self.batch_size
        padded = self.batch_size if self.pads_to_batch_size else len(members)
        return RequestBatch(members, padded, self.pad_prompts)

    def on_step_done(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        batch = self.batch
        if batch is None:
            raise ValueError("on_step_done without a running batch")
        finished = batch.apply(plan, now)
        if batch.done:  # the longest member is done: the whole batch's KV goes back
            self._end_batch()
        return finished

    def _end_batch(self) -> None:
        assert self.batch is not None
        for req in self.batch.members:
            self.kv.free(req.request_id)  # an aborted member's is gone already: a no-op
        self.batch = None

    def decode_run(self, max_steps: int = 1 << 16) -> DecodeRun | None:
        """The running batch's remaining decode steps (RequestBatch.decode_run): nothing that
        arrives joins it, so the run goes on across its members' finishes to its end."""
        if self.batch is None:
            return None
        return self.batch.decode_run(self.kv, len(self.waiting), self.kv_blocked, max_steps)

    def advance_decodes(self, run: DecodeRun, begin: int, end: int,
                        step_end_s: Sequence[float]) -> list[RunSegment]:
        """Apply steps [begin, end) of the last decode_run() (those before `begin` applied
        already): a segment's plain steps in bulk, then the step its members finish in
        planned and applied as step by step, at its end `step_end_s[s]`; the batch ends
        (its KV freed) with its last member's step."""
        assert 0 <= begin < end <= run.steps
        batch, kv, out = self.batch, self.kv, []
        for start, length, shape in run.segment_lengths():
            first, stop = max(start, begin), min(start + length, end)
            if first >= stop:
                continue
            assert batch is not None and batch is self.batch
            k = stop - first
            finishes = any(r.output_tokens - r.num_output_done == k for r in batch.members
                           if r.state is RequestState.RUNNING)
            plain = k - 1 if finishes else k
            # the recorders count live tokens from the shape's context sum: the plan's own
            # contexts, without the prompt padding the priced shape carries
            part = DecodeRun(plain, decode_shape(shape, first - start)._replace(
                                 decode_context_sum=batch.live_context_sum()),
                             run.kv_blocks_used[first:first + plain], run.num_waiting, False,
                             run.block_size, run.kv_blocked)
            if plain:
                batch.advance_plain(plain, kv)
            if not finishes:
                out.append(RunSegment(first, part, None))
                continue
            held = self.kv_slots_held
            plan = batch.plan(kv)
            finished = self.on_step_done(plan, SCRIPTED, step_end_s[stop - 1])
            out.append(RunSegment(first, part, FinishStep(plan, finished, self.kv_blocks_used,
                                                          held, self.num_running)))
        return out
