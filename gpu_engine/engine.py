"""The engine loop: a `sim.core` scheduler driving real prefill and decode kernels.

It follows the step contract of DESIGN.md exactly as the SimPy world does
(sim/des.py), so the two produce the same plans for the same arrivals and
latencies: arrivals that happen by the end of a step are added (each at its
own arrival instant) before `on_step_done`, and are seen by the next
`schedule()`; `close()` follows the last arrival; an idle engine waits for
the next arrival or the scheduler's wakeup, and the step after the wait starts
at that instant (the arrival's admission and the wait's lateness are part of
the step). Arrival instants are accumulated the way SimPy does (previous
arrival + gap) and a step ends at start + duration, so even float rounding
agrees: the simulator fed a wall-clock replay's step durations reproduces its
timestamps exactly (calibrate/recorded.py).

Time comes from a clock: the wall clock (real serving, arrivals replayed in
real time) or a virtual clock that a latency model advances by each step's
predicted duration (the simulator's time, for testing the promise above and
for what-if runs at real kernels' outputs). Either way every step is logged
with its `StepShape`, its whole-step wall time and its device time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import LlamaModel
from gpu_engine.prompts import prompt_token_ids
from gpu_engine.runner import ModelRunner
from gpu_engine.sampling import SamplingParams, sample
from gpu_engine.speculative import ModelDrafter, NgramDrafter
from gpu_engine.speculative_step import execute_speculative
from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.metrics import RunRecorder

_SEED_STRIDE = 1_000_003  # per-request sampling seeds: engine seed x stride + request id
_SPIN_S = 0.002  # WallClock.wait_until busy-waits this long before its target
GREEDY = SamplingParams()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One streamed token: `index` counts the request's output tokens from 0."""

    request_id: int
    token_id: int
    index: int
    time_s: float
    finished: bool


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


@dataclass(slots=True, eq=False)
class _Sequence:
    request: Request
    token_ids: list[int]  # prompt, then every emitted token
    sampling: SamplingParams
    seed: int | None  # sampled requests' seed (gpu_engine.sampling.uniforms)
    stopped: bool = False  # hit EOS with stop_at_eos: the stream ends there


class WallClock:
    """Seconds since the clock was made, from the monotonic performance counter.

    `spin_s`: how much of each idle wait is spent spinning rather than asleep; inf keeps
    the core busy throughout (a sleeping virtual CPU runs the next tens of ms slower).
    """

    def __init__(self, spin_s: float = _SPIN_S) -> None:
        self._origin = time.perf_counter()
        self._spin_s = spin_s

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def wait_until(self, t_s: float) -> None:
        """Sleep, then spin the last stretch: a loaded machine wakes a sleeper milliseconds
        late, which would add to every idle arrival's TTFT (the simulator adds nothing)."""
        delay_s = t_s - self.now() - self._spin_s
        if delay_s > 0:
            time.sleep(delay_s)
        while self.now() < t_s:
            pass


@dataclass(slots=True)
class VirtualClock:
    """Time that moves only when told to: by a latency model's step time, or to an arrival."""

    t_s: float = 0.0

    def now(self) -> float:
        return self.t_s

    def wait_until(self, t_s: float) -> None:
        self.t_s = max(self.t_s, t_s)


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
        token_ids, counts, device_s = self._execute(plan)
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
                                  device_s, plan.shape, plan.batch_size, held, counts))
        return plan, finished

    def _execute(self, plan: StepPlan) -> tuple[list[int], tuple[int, ...], float]:
        """Run the plan; returns every emitted token (in plan order), per-sequence counts
        (empty = one each, no speculation) and the device seconds."""
        seqs = [self._seqs[rid] for rid in plan.request_ids]
        new_ids = [s.token_ids[ctx:ctx + n] for s, ctx, n in
                   zip(seqs, plan.context_tokens, plan.num_new_tokens, strict=True)]
        if plan.num_spec_tokens:
            return self._execute_speculative(plan, seqs, new_ids)
        inputs = self.runner.prepare(new_ids, plan.context_tokens, plan.block_tables,
                                     plan.emits_token, min_seqs=plan.shape.padded_batch,
                                     seq_ids=plan.request_ids)
        emitting = [s for s, e in zip(seqs, plan.emits_token, strict=True) if e]

        def draw(logits: torch.Tensor) -> torch.Tensor:
            return sample(logits, [s.sampling for s in emitting], [s.seed for s in emitting],
                          [len(s.token_ids) for s in emitting])

        token_ids, device_s = self.runner.execute(inputs, draw)
        return token_ids, (), device_s

    def _execute_speculative(self, plan: StepPlan, seqs: list[_Sequence],
                             new_ids: list[list[int]]
                             ) -> tuple[list[int], tuple[int, ...], float]:
        """Draft k_i tokens per speculating sequence, verify them all in one target pass."""
        if self.drafter is None:
            raise RuntimeError("the scheduler speculates but the engine has no drafter")
        return execute_speculative(self.runner, self.drafter, plan, seqs, new_ids)

    def _emit(self, plan: StepPlan, token_ids: list[int], counts: tuple[int, ...],
              now: float) -> None:
        rids = [rid for rid, e in zip(plan.request_ids, plan.emits_token, strict=True) if e]
        tokens = iter(token_ids)
        for rid, count in zip(rids, counts or (1,) * len(rids), strict=True):
            seq = self._seqs[rid]
            for _ in range(count):
                self._emit_one(seq, next(tokens), now)

    def _emit_one(self, seq: _Sequence, token: int, now: float) -> None:
        seq.token_ids.append(token)
        index = len(seq.token_ids) - seq.request.prompt_tokens - 1
        finished = index + 1 >= seq.request.output_tokens
        if seq.stopped:
            return
        if seq.sampling.stop_at_eos and token == self.eos_id:
            seq.stopped = finished = True
        event = TokenEvent(seq.request.request_id, token, index, now, finished)
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
        step and its finished requests, forget those, drop the step's token events."""
        log = self.steps[-1]
        recorder.record_step(log.start_s, log.duration_s, plan, self.scheduler.num_waiting,
                             self.scheduler.num_running, self.scheduler.kv_blocks_used,
                             log.kv_slots_held)
        if getattr(self.scheduler, "speculative_tokens", 0):
            recorder.record_speculation(plan, StepResult((), log.num_emitted))
        for request in finished:
            recorder.record_finished(request)
            self.release(request.request_id)
        if finished and on_done is not None:
            on_done(len(finished))
        self._events.clear()

    def replay(self, requests: Iterable[Request], recorder: RunRecorder,
               sampling: SamplingParams = GREEDY,
               on_done: Callable[[int], None] | None = None) -> float:
        """Serve `requests` (sorted by arrival) as they arrive; returns the end time in seconds.

        Every step and finished or rejected request goes to `recorder`, as in
        the simulator. Token streams are not kept: events are dropped per step.
        """
        pending = iter(requests)
        upcoming: list[Request] = []  # at most one request read ahead
        state = {"t_s": 0.0, "closed": False}

        def next_arrival() -> Request | None:
            if not upcoming:
                nxt = next(pending, None)
                if nxt is None:
                    return None
                upcoming.append(nxt)
            return upcoming[0]

        def admit_until(t_s: float) -> None:
            while (req := next_arrival()) is not None:
                gap_s = req.arrival_s - state["t_s"]
                at_s = state["t_s"] + gap_s if gap_s > 0 else state["t_s"]  # as SimPy adds it
                if at_s > t_s:
                    return
                upcoming.pop()
                state["t_s"] = at_s
                if not self.add_request(req, sampling, now=at_s):
                    recorder.record_rejected(req)
                    if on_done is not None:
                        on_done(1)
            if not state["closed"]:
                state["closed"] = True
                self.scheduler.close(state["t_s"])

        # The engine's time as the simulator keeps it: the end of the last step, or the
        # arrival or wakeup an idle wait was for. A step after an idle wait starts at that
        # instant, so the arrival's admission and the wait's lateness count in the step (and
        # in TTFT, which runs from the arrival) and arrivals after it are seen next step, as
        # in the simulator; the clock then only has to catch up with it.
        now_s = 0.0
        admit_until(now_s)
        while True:
            outcome = self.step(admit_until, start_s=now_s)
            if outcome is not None:
                self.record(*outcome, recorder, on_done)
                now_s = self.steps[-1].start_s + self.steps[-1].duration_s
                continue
            nxt = next_arrival()
            wakeup_s = self.scheduler.next_wakeup(now_s)
            if nxt is None and wakeup_s is None:
                if not state["closed"]:
                    admit_until(now_s)
                    continue
                return now_s
            targets = [] if wakeup_s is None else [now_s + max(0.0, wakeup_s - now_s)]
            if nxt is not None:  # as SimPy adds the gap to the last arrival
                targets.append(state["t_s"] + max(0.0, nxt.arrival_s - state["t_s"]))
            now_s = min(targets)
            self.clock.wait_until(now_s)
            admit_until(now_s)
