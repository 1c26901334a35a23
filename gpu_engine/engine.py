"""The engine: a `sim.core` scheduler driving real prefill and decode kernels, step by step.

`Engine.step` is the step contract on real kernels: schedule, run the plan
(gpu_engine.runner; speculative steps gpu_engine.spec_step), sample, stream the
tokens, apply. A replay's loop (arrivals, idle waits, closing) is
sim.core.drive, the one that keeps the SimPy world's time exactly (arrival
instants accumulated as SimPy does, a step ending at start + duration), so the
simulator fed a wall-clock replay's step durations reproduces its timestamps
(calibrate/recorded.py) and a virtual-clock replay makes the simulator's plans.

Time comes from a clock (gpu_engine.clock): the wall clock, or a virtual clock
that a latency model advances by each step's predicted duration. Either way
every step is logged with its `StepShape`, its whole-step wall time and its
device time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from gpu_engine.clock import VirtualClock, WallClock
from gpu_engine.drafters import ModelDrafter, NgramDrafter
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import LlamaModel
from gpu_engine.prompts import prompt_token_ids
from gpu_engine.runner import ModelRunner
from gpu_engine.sampling import SamplingParams, adjust_logits, sample, token_logprobs
from gpu_engine.spec_step import execute_speculative
from sim.core.drive import drive
from sim.core.plan import StepPlan, StepResult, StepShape, checked_plan
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.results.record.recorder import RunRecorder
from sim.results.record.recording import record_step

_SEED_STRIDE = 1_000_003  # per-request sampling seeds: engine seed x stride + request id
GREEDY = SamplingParams()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One streamed token: `index` counts the request's output tokens from 0."""

    request_id: int
    token_id: int
    index: int
    time_s: float
    finished: bool
    # (its log-probability, the k most likely (token id, log-probability)) when asked for
    logprobs: tuple[float, tuple[tuple[int, float], ...]] | None = None


@dataclass(frozen=True, slots=True)
class StepLog:
    """What calibration needs of an executed step; times in seconds."""

    start_s: float
    duration_s: float  # what the clock advanced: wall time since the previous step ended
    #                    (since this one began after an idle wait), or the latency model's
    wall_s: float  # schedule + input preparation + kernels + sampling + bookkeeping
    device_s: float  # the kernels and sampling alone
    shape: StepShape
    num_seqs: int
    kv_slots_held: int  # while the step ran (before finishers freed theirs)
    num_emitted: tuple[int, ...] = ()  # speculative steps: tokens per emitting sequence
    rows: int = 0  # sequences the kernels ran over, padding included: the plan's padded_batch


@dataclass(slots=True, eq=False)
class _Sequence:
    request: Request
    token_ids: list[int]  # prompt, then every emitted token
    sampling: SamplingParams
    seed: int | None  # sampled requests' seed (gpu_engine.sampling.uniforms)
    stopped: bool = False  # hit EOS with stop_at_eos: the stream ends there


@dataclass(slots=True)
class Engine:
    """Serves requests on `model` with `scheduler`; `latency` set = virtual clock."""

    model: LlamaModel
    kv: PagedKVCache
    scheduler: Scheduler
    runner: ModelRunner
    seed: int = 0
    latency: LatencyModel | None = None
    eos_id: int | None = None
    on_token: Callable[[TokenEvent], None] | None = None
    drafter: NgramDrafter | ModelDrafter | None = None  # speculative decoding's proposer
    clock: WallClock | VirtualClock = field(init=False)
    steps: list[StepLog] = field(default_factory=list, init=False)
    _seqs: dict[int, _Sequence] = field(default_factory=dict, init=False)
    _events: list[TokenEvent] = field(default_factory=list, init=False)
    _busy_end_s: float | None = field(default=None, init=False)  # last step's end, if busy
    _logprobs: dict[int, tuple] = field(default_factory=dict, init=False)  # this step's asked

    def __post_init__(self) -> None:
        self.clock = VirtualClock() if self.latency is not None else WallClock()

    @property
    def vocab_size(self) -> int:
        return self.model.spec.vocab_size

    # -- requests ----------------------------------------------------------------
    def add_request(self, request: Request, sampling: SamplingParams = GREEDY,
                    now: float | None = None) -> bool:
        """Queue `request` (its prompt ids, or ids synthesised from the engine seed)."""
        ids = prompt_token_ids(request, self.vocab_size, self.seed)
        seed = None
        if sampling.temperature > 0:
            seed = sampling.seed if sampling.seed is not None else \
                self.seed * _SEED_STRIDE + request.request_id
        self._seqs[request.request_id] = _Sequence(request, ids, sampling, seed)
        accepted = self.scheduler.add(request, self.clock.now() if now is None else now)
        if not accepted:
            del self._seqs[request.request_id]
        return accepted

    def output_ids(self, request_id: int) -> list[int]:
        seq = self._seqs[request_id]
        return seq.token_ids[seq.request.prompt_tokens:]

    def release(self, request_id: int) -> list[int]:
        """Forget a finished request; returns its output ids."""
        out = self.output_ids(request_id)
        del self._seqs[request_id]
        if self.drafter is not None:
            self.drafter.forget(request_id)
        return out

    def abort(self, request_id: int, now: float | None = None) -> Request | None:
        """Drop a request between steps (its client went away): the scheduler frees its KV
        blocks and the engine forgets its tokens. None if it had finished or is unknown."""
        request = self.scheduler.abort(request_id, self.clock.now() if now is None else now)
        if request is not None:
            self.release(request_id)
        return request

    # -- steps -------------------------------------------------------------------
    def step(self, arrivals: Callable[[float], None] | None = None,
             start_s: float | None = None) -> tuple[StepPlan, list[Request]] | None:
        """Run one step; None when nothing is runnable now.

        `arrivals(t)` is called once the step is over, before the scheduler
        learns its result, to add every request that arrived by `t`.
        `start_s`: when the step begins on the engine's clock (replay passes the
        arrival or wakeup an idle wait was for); None = where the last step ended
        (back to back), or now after an idle spell.
        """
        started = time.perf_counter()
        if start_s is None:
            # Back to back on the wall clock: this step began when the last one ended, so
            # the host work between them (its bookkeeping, the caller's recording) is
            # charged here and recorded durations tile the busy time, as simulated steps
            # do; a calibration table predicts this whole cycle.
            start_s = self.clock.now() if self._busy_end_s is None else self._busy_end_s
        plan = self.scheduler.schedule(start_s)
        if plan is None:
            self._busy_end_s = None
            return None
        held = self.scheduler.kv_slots_held
        token_ids, counts, device_s, rows = self._execute(plan)
        if self.latency is not None:
            duration_s = self.latency.step_time(plan.shape)
        else:
            duration_s = self.clock.now() - start_s
        # the end as SimPy reckons it (start + duration), so a simulation fed these durations
        # lands on the very same floats
        end_s = self._busy_end_s = start_s + duration_s
        if self.latency is not None:
            self.clock.t_s = end_s
        if arrivals is not None:
            arrivals(end_s)
        self._emit(plan, token_ids, counts, end_s)
        result = StepResult(tuple(token_ids), counts)
        finished = self.scheduler.on_step_done(plan, result, end_s)
        self.steps.append(StepLog(start_s, duration_s, time.perf_counter() - started,
                                  device_s, plan.shape, plan.batch_size, held, counts, rows))
        return plan, finished

    def _execute(self, plan: StepPlan) -> tuple[list[int], tuple[int, ...], float, int]:
        """Run the plan; returns every emitted token (in plan order), per-sequence counts
        (empty = one each, no speculation), the device seconds and the rows run; a plan
        whose columns disagree in length is refused before a kernel runs."""
        seqs = [self._seqs[rid] for rid in checked_plan(plan).request_ids]
        new_ids = [s.token_ids[ctx:ctx + n] for s, ctx, n in
                   zip(seqs, plan.context_tokens, plan.num_new_tokens, strict=True)]
        if plan.num_spec_tokens:
            return (*execute_speculative(self.runner, self.drafter, plan, seqs, new_ids),
                    plan.batch_size)
        inputs = self.runner.prepare(new_ids, plan.context_tokens, plan.block_tables,
                                     plan.emits_token, min_seqs=plan.shape.padded_batch,
                                     seq_ids=plan.request_ids)
        emitting = [s for s, e in zip(seqs, plan.emits_token, strict=True) if e]

        wants = [i for i, s in enumerate(emitting) if s.sampling.logprobs is not None]
        found: list[tuple[torch.Tensor, ...]] = []

        def draw(raw: torch.Tensor) -> torch.Tensor:
            params = [s.sampling for s in emitting]
            logits = adjust_logits(raw, params, [s.token_ids for s in emitting],
                                   [s.request.prompt_tokens for s in emitting])
            tokens = sample(logits, params, [s.seed for s in emitting],
                            [len(s.token_ids) for s in emitting])
            if wants:
                found.append(token_logprobs(raw, tokens, wants, max(
                    emitting[i].sampling.logprobs or 0 for i in wants)))
            return tokens

        token_ids, device_s = self.runner.execute(inputs, draw)
        if found:  # after execute's synchronisation: plain lists
            chosen, top_ids, top_lps = (t.tolist() for t in found[0])
            for j, i in enumerate(wants):
                k = emitting[i].sampling.logprobs or 0
                self._logprobs[emitting[i].request.request_id] = (
                    chosen[j], tuple(zip(top_ids[j][:k], top_lps[j][:k], strict=True)))
        return token_ids, (), device_s, inputs.num_seqs

    def _emit(self, plan: StepPlan, token_ids: list[int], counts: tuple[int, ...],
              now: float) -> None:
        rids = [rid for rid, e in zip(plan.request_ids, plan.emits_token, strict=True) if e]
        tokens = iter(token_ids)
        for rid, count in zip(rids, counts or (1,) * len(rids), strict=True):
            seq = self._seqs[rid]
            # verified drafts past the scripted output are discarded, as vLLM stops at
            # max_tokens (the scheduler drafts k whatever is left)
            left = seq.request.output_tokens - (len(seq.token_ids) - seq.request.prompt_tokens)
            for i in range(count):
                token = next(tokens)
                if i < left:
                    self._emit_one(seq, token, now)

    def _emit_one(self, seq: _Sequence, token: int, now: float) -> None:
        logprobs = self._logprobs.pop(seq.request.request_id, None)
        seq.token_ids.append(token)
        index = len(seq.token_ids) - seq.request.prompt_tokens - 1
        finished = index + 1 >= seq.request.output_tokens
        if seq.stopped:
            return
        if seq.sampling.stop_at_eos and token == self.eos_id:
            seq.stopped = finished = True
        event = TokenEvent(seq.request.request_id, token, index, now, finished, logprobs)
        self._events.append(event)
        if self.on_token is not None:
            self.on_token(event)

    def stream(self) -> Iterator[TokenEvent]:
        """Step until nothing is left to run, yielding each token as its step ends."""
        while self.step() is not None:
            yield from self._events
            self._events.clear()
        self._events.clear()

    def drain_events(self) -> list[TokenEvent]:
        events, self._events = self._events, []
        return events

    # -- replay ------------------------------------------------------------------
    def record(self, plan: StepPlan, finished: list[Request], recorder: RunRecorder,
               on_done: Callable[[int], None] | None = None) -> None:
        """What replay does after each step (calibration times the same work): record the
        step and its finished requests (sim.results.record.recording, as the simulator does),
        forget those, drop the step's token events."""
        log = self.steps[-1]
        speculating = self.scheduler.speculative_tokens > 0
        record_step((recorder,), self.scheduler, log.start_s, log.duration_s, plan, finished,
                    log.kv_slots_held, StepResult((), log.num_emitted) if speculating else None)
        for request in finished:
            self.release(request.request_id)
        if finished and on_done is not None:
            on_done(len(finished))
        self._events.clear()

    def replay(self, requests: Iterable[Request], recorder: RunRecorder,
               sampling: SamplingParams = GREEDY,
               on_done: Callable[[int], None] | None = None) -> float:
        """Serve `requests` (sorted by arrival) as they arrive; returns the end time in seconds.

        The loop is sim.core.drive's, which keeps time as the simulator does: the
        end of the last step, or the arrival or wakeup an idle wait was for. A step
        after an idle wait starts at that instant, so the arrival's admission and the
        wait's lateness count in the step (and in TTFT, which runs from the arrival);
        the clock then only has to catch up with it. Every step and finished or
        rejected request goes to `recorder`; token streams are not kept.
        """

        def add(request: Request, at_s: float) -> bool:
            return self.add_request(request, sampling, now=at_s)

        def rejected(request: Request) -> None:
            recorder.record_rejected(request)
            if on_done is not None:
                on_done(1)

        def step(start_s: float, admit_until: Callable[[float], None]) -> float | None:
            outcome = self.step(admit_until, start_s=start_s)
            if outcome is None:
                return None
            self.record(*outcome, recorder, on_done)
            return self.steps[-1].start_s + self.steps[-1].duration_s

        return drive(self.scheduler, requests, step, add, rejected, self.clock.wait_until)
