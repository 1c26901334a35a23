"""TTFT diagnosis: each request's time to first token split into its causes.

TTFT = first token - arrival is split into parts that sum to it exactly:
- before the first admission, the wait is split by the replica's `WaitClock`:
  `kv_wait` (admission stopped for lack of KV blocks, or the step preempted;
  request-level batching: a batch launched short on a full pool), `batch_fill` (the server sat
  idle: request-level batching waiting for a batch to fill), and `queue` (the
  rest: the server was busy and the token budget, the batch seats or FCFS
  order, or for static and dynamic batching the running batch, held it back;
  it includes the remainder of the step running when it arrived);
- from admission to first token: `prefill`, its own share of the steps that
  computed its prompt; `preempt`, the wait from each preemption to re-admission
  plus its share of steps spent recomputing KV it had lost; `shared`, the rest:
  other sequences' shares of its prefill steps, padding, and steps it sat in
  the running set without tokens (chunked interleaving).
A shared step's duration is split in proportion to the tokens each sequence
computes in it (a chunk counts its tokens, a decode one per position); padded
tokens and slots belong to no one and fall to `shared`. Why tokens: the linear
layers, which dominate prefill steps, scale with them, and the rule needs
nothing from the latency model, so it holds for calibrated tables too.

`prefix_saved` estimates the time the cached prefix tokens did not cost: the
latency model's time for the whole prompt alone minus the uncached part after
the cached context. It is reported apart and is not part of the sum.

Columns (ms) in requests.csv: ttft_queue_ms, ttft_batch_fill_ms, ttft_kv_wait_ms,
ttft_prefill_ms, ttft_shared_ms, ttft_preempt_ms, prefix_saved_ms. Python work per step
is O(prefilling sequences) plus two C-level passes over the plan's columns; nothing is
kept per step, and state lives only for requests between arrival and first token.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import compress

import numpy as np
import pandas as pd

from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request
from sim.des import ReplicaSetup
from sim.metrics import RunRecorder
from sim.trace import RequestTracer, WaitClock

# the parts, in the order they are printed; they sum to ttft_ms
TTFT_PARTS = ("ttft_queue_ms", "ttft_batch_fill_ms", "ttft_kv_wait_ms", "ttft_prefill_ms",
              "ttft_shared_ms", "ttft_preempt_ms")
# context for the words: requests waiting ahead and running at its arrival, its prefill
# steps and the other sequences sharing them on average
_FLOAT_COLUMNS = (*TTFT_PARTS, "prefix_saved_ms", "mean_others_in_prefill")
_INT_COLUMNS = ("queue_ahead", "running_at_arrival", "prefill_steps")


@dataclass(slots=True, eq=False)
class _Pending:
    """One request between arrival and first token (seconds; -1.0 = not yet)."""

    arrival_s: float
    idle0_s: float
    kv0_s: float
    ahead: int
    running: int
    prompt: int
    admit_s: float = -1.0
    idle_wait_s: float = 0.0
    kv_wait_s: float = 0.0
    own_s: float = 0.0
    recompute_s: float = 0.0
    preempt_s: float = 0.0
    preempted_at_s: float = -1.0
    computed_max: int = 0
    recompute_to: int = 0
    steps: int = 0
    others: int = 0
    saved_s: float = 0.0


class TTFTDiagnoser:
    """Accumulates the TTFT parts of every request of one replica (see the module docstring)."""

    __slots__ = ("clock", "scheduler", "step_time", "_pending", "_cols")

    def __init__(self, clock: WaitClock, scheduler: object,
                 step_time: Callable[[StepShape], float]) -> None:
        self.clock = clock
        self.scheduler = scheduler
        self.step_time = step_time
        self._pending: dict[int, _Pending] = {}
        self._cols: dict[str, array] = {"request_id": array("q")}
        self._cols.update({name: array("d") for name in _FLOAT_COLUMNS})
        self._cols.update({name: array("q") for name in _INT_COLUMNS})

    def on_arrival(self, request: Request, now_s: float) -> None:
        idle_s, kv_s = self.clock.at(now_s)
        sched = self.scheduler
        self._pending[request.request_id] = _Pending(
            now_s, idle_s, kv_s, sched.num_waiting - 1, sched.num_running,  # type: ignore
            request.prompt_tokens)

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        pending = self._pending
        if not pending:
            return
        for rid in plan.preempted_ids:
            p = pending.get(rid)
            if p is not None and p.admit_s >= 0.0:
                p.preempted_at_s = start_s
        shape = plan.shape
        if not shape.prefill_chunk_tokens:
            return  # only decodes: nobody before its first token computes anything
        news = plan.num_new_tokens
        real = sum(news)
        pad = max(0, shape.num_tokens - real) + max(0, shape.padded_batch - len(news))
        per_token_s = duration_s / (real + pad)
        others = len(news) - 1
        contexts, emits = plan.context_tokens, plan.emits_token
        for i in compress(range(len(news)), plan.is_prefill):
            p = pending.get(plan.request_ids[i])
            if p is None:
                continue  # past its first token (a re-prefill after preemption)
            new, context = news[i], contexts[i]
            if p.admit_s < 0.0:
                self._admitted(p, start_s, context)
            elif p.preempted_at_s >= 0.0:
                p.preempt_s += start_s - p.preempted_at_s
                p.preempted_at_s = -1.0
                p.recompute_to = p.computed_max
            redo = min(new, max(0, p.recompute_to - context))
            p.own_s += (new - redo) * per_token_s
            p.recompute_s += redo * per_token_s
            if context + new > p.computed_max:
                p.computed_max = context + new
            p.steps += 1
            p.others += others
            if emits[i]:
                self._finish(plan.request_ids[i], p, start_s + duration_s)

    def _admitted(self, p: _Pending, start_s: float, context: int) -> None:
        idle_s, kv_s = self.clock.at(start_s)
        p.admit_s = start_s
        p.idle_wait_s = idle_s - p.idle0_s
        p.kv_wait_s = kv_s - p.kv0_s
        p.computed_max = context  # served by the prefix cache
        if context:
            whole = self.step_time(StepShape(prefill_chunk_tokens=(p.prompt,),
                                             prefill_context_tokens=(0,), padded_batch=1))
            rest = self.step_time(StepShape(prefill_chunk_tokens=(p.prompt - context,),
                                            prefill_context_tokens=(context,), padded_batch=1))
            p.saved_s = max(0.0, whole - rest)

    def _finish(self, rid: int, p: _Pending, first_token_s: float) -> None:
        wait_s = p.admit_s - p.arrival_s
        running_s = first_token_s - p.admit_s
        c = self._cols
        c["request_id"].append(rid)
        c["ttft_queue_ms"].append((wait_s - p.idle_wait_s - p.kv_wait_s) * 1e3)
        c["ttft_batch_fill_ms"].append(p.idle_wait_s * 1e3)
        c["ttft_kv_wait_ms"].append(p.kv_wait_s * 1e3)
        c["ttft_prefill_ms"].append(p.own_s * 1e3)
        c["ttft_shared_ms"].append((running_s - p.own_s - p.recompute_s - p.preempt_s) * 1e3)
        c["ttft_preempt_ms"].append((p.preempt_s + p.recompute_s) * 1e3)
        c["prefix_saved_ms"].append(p.saved_s * 1e3)
        c["queue_ahead"].append(p.ahead)
        c["running_at_arrival"].append(p.running)
        c["prefill_steps"].append(p.steps)
        c["mean_others_in_prefill"].append(p.others / p.steps)
        del self._pending[rid]

    def frame(self) -> pd.DataFrame:
        """One row per request that reached its first token, keyed by request_id."""
        return pd.DataFrame({k: np.array(v, dtype=np.float64 if v.typecode == "d" else np.int64)
                             for k, v in self._cols.items()})


class ReplicaObserver:
    """One replica's observer: its wait clock, TTFT diagnosis and (optionally) a tracer."""

    __slots__ = ("clock", "diagnoser", "tracer")

    def __init__(self, scheduler: object, step_time: Callable[[StepShape], float],
                 traced: frozenset[int] = frozenset()) -> None:
        self.clock = WaitClock(scheduler)
        self.diagnoser = TTFTDiagnoser(self.clock, scheduler, step_time)
        self.tracer = RequestTracer(self.clock, traced) if traced else None

    def on_arrival(self, request: Request, now_s: float) -> None:
        self.diagnoser.on_arrival(request, now_s)
        if self.tracer is not None:
            self.tracer.on_arrival(request, now_s)

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        self.clock.on_step(start_s, duration_s, plan)
        self.diagnoser.on_step(start_s, duration_s, plan)
        if self.tracer is not None:
            self.tracer.on_step(start_s, duration_s, plan)


def observe(setups: Sequence[ReplicaSetup], traced: frozenset[int] = frozenset()
            ) -> list[ReplicaSetup]:
    """`setups`, each with its own ReplicaObserver (clocks are per replica)."""
    return [replace(s, observer=ReplicaObserver(s.scheduler, s.latency.step_time, traced))
            for s in setups]


def collect(setups: Sequence[ReplicaSetup], fleet: RunRecorder) -> pd.DataFrame | None:
    """Join each replica's TTFT parts into its recorder and the fleet's; return the traced
    requests' timelines (None when nothing was traced)."""
    observers, frames = [], []
    for s in setups:
        if isinstance(s.observer, ReplicaObserver):
            observers.append(s.observer)
            frames.append(s.observer.diagnoser.frame())
            s.recorder.add_columns(frames[-1])
    if frames:
        fleet.add_columns(pd.concat(frames, ignore_index=True))
    traces = [o.tracer.frame() for o in observers if o.tracer is not None]
    return pd.concat(traces, ignore_index=True) if traces else None


# -- plain words -------------------------------------------------------------------------
PART_LABELS = {
    "ttft_queue_ms": "queueing for admission",
    "ttft_batch_fill_ms": "waiting for a batch to fill",
    "ttft_kv_wait_ms": "waiting for KV blocks",
    "ttft_prefill_ms": "its own prefill compute",
    "ttft_shared_ms": "others' work in its steps",
    "ttft_preempt_ms": "preemption + recompute",
}
REQUEST_LEVEL = ("static", "dynamic")


class DiagnosisError(ValueError):
    """A user mistake (no such run, request or column): printed as one line."""


def dominant_cause(row: pd.Series) -> str:
    """The TTFT part (a TTFT_PARTS name) that took the most time."""
    return max(TTFT_PARTS, key=lambda name: float(row[name]))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def cause_sentence(row: pd.Series, cause: str, policy: str) -> str:
    """One sentence naming `cause` for this request, with its size and share of the TTFT."""
    ms = float(row[cause])
    ttft = float(row["ttft_ms"])
    share = f"{ms:.1f} ms ({100 * ms / ttft:.0f}% of its TTFT)" if ttft > 0 else f"{ms:.1f} ms"
    ahead, running = int(row["queue_ahead"]), int(row["running_at_arrival"])
    steps = int(row["prefill_steps"])
    others = float(row["mean_others_in_prefill"])
    batching = policy in REQUEST_LEVEL
    if cause == "ttft_queue_ms" and batching:
        return (f"waited {share} for the running batch to finish, with "
                f"{_plural(ahead, 'request')} queued ahead of it: {policy} batching admits "
                "requests only between batches")
    if cause == "ttft_queue_ms":
        return (f"waited {share} in the queue behind {_plural(ahead, 'request')} while "
                f"{running} ran: admission happens between steps, and each step's token "
                "budget and batch seats go to running and earlier requests first")
    if cause == "ttft_batch_fill_ms":
        trigger = ("or its oldest request has waited max_wait" if policy == "dynamic"
                   else "or arrivals end")
        return (f"waited {share} with the server idle for its batch to fill: {policy} "
                f"batching launches a batch only when it is full {trigger}")
    if cause == "ttft_kv_wait_ms":
        return (f"waited {share} for free KV-cache blocks: admission stopped because the KV "
                f"cache was full ({_plural(ahead, 'request')} queued ahead of it)")
    if cause == "ttft_prefill_ms":
        computed = int(row["prompt_tokens"]) - int(row["prefix_hit_tokens"])
        return (f"spent {share} computing its own prompt: {computed} uncached tokens in "
                f"{_plural(steps, 'step')}")
    if cause == "ttft_shared_ms" and batching:
        return (f"spent {share} on the rest of its batch's prefill: about {others:.0f} other "
                "prompts computed in the same step, padded to the longest")
    if cause == "ttft_shared_ms":
        return (f"spent {share} on other sequences' work in its {_plural(steps, 'prefill step')}"
                f" (about {others:.0f} others per step): chunked prefill interleaves its prompt "
                "with their decodes and prefills")
    return (f"lost {share} to preemption ({_plural(int(row['preemptions']), 'time')} in all): "
            "waiting to be re-admitted, then recomputing whatever KV was dropped")


def explain_request(row: pd.Series, policy: str = "continuous") -> str:
    """The dominant cause in plain words, then every part of the TTFT (ms and share)."""
    ttft = float(row["ttft_ms"])
    lines = [f"request {int(row['request_id'])}: TTFT {ttft:.1f} ms (prompt "
             f"{int(row['prompt_tokens'])} tokens, {int(row['prefix_hit_tokens'])} from the "
             f"prefix cache; {int(row['output_tokens'])} output tokens)",
             f"  request {int(row['request_id'])} "
             f"{cause_sentence(row, dominant_cause(row), policy)}."]
    for name in TTFT_PARTS:
        ms = float(row[name])
        pct = 100 * ms / ttft if ttft > 0 else 0.0
        lines.append(f"    {PART_LABELS[name]:<30} {ms:10.1f} ms {pct:6.1f}%")
    lines.append(f"    {'prefix cache saved (not summed)':<30} "
                 f"{float(row['prefix_saved_ms']):10.1f} ms")
    return "\n".join(lines)


def run_breakdown(frame: pd.DataFrame) -> pd.Series:
    """Share of all finished requests' TTFT that each part took (sums to 1)."""
    done = frame.dropna(subset=["ttft_ms", *TTFT_PARTS])
    total = float(done["ttft_ms"].sum())
    return pd.Series({name: float(done[name].sum()) / total if total > 0 else 0.0
                      for name in TTFT_PARTS})


def explain_run(frame: pd.DataFrame, policy: str = "continuous", slowest: int = 3,
                request_id: int | None = None) -> str:
    """`request_id`'s explanation, or the run's TTFT breakdown and its `slowest` requests."""
    missing = [c for c in TTFT_PARTS if c not in frame.columns]
    if missing:
        raise DiagnosisError(f"requests have no TTFT diagnosis columns ({', '.join(missing)}); "
                             "re-run the scenario with this version of servesim")
    done = frame[frame["status"] == "finished"].dropna(subset=list(TTFT_PARTS))
    if request_id is not None:
        match = frame[frame["request_id"] == request_id]
        if match.empty:
            raise DiagnosisError(f"--request: no request {request_id} in this run (ids "
                                 f"{int(frame['request_id'].min())}.."
                                 f"{int(frame['request_id'].max())})")
        if match.iloc[0]["status"] != "finished":
            raise DiagnosisError(f"--request: request {request_id} was rejected "
                                 f"({match.iloc[0]['rejection_reason']}): it has no TTFT")
        return explain_request(match.iloc[0], policy)
    if slowest < 1:
        raise DiagnosisError(f"--slowest: must be >= 1, got {slowest}")
    if done.empty:
        return "no finished requests: nothing to explain"
    shares = run_breakdown(done)
    parts = ", ".join(f"{PART_LABELS[n]} {100 * s:.0f}%" for n, s in
                      shares.sort_values(ascending=False).items() if s >= 0.005)
    head = (f"{len(done)} finished requests, {policy} batching: mean TTFT "
            f"{done['ttft_ms'].mean():.1f} ms, p99 {done['ttft_ms'].quantile(0.99):.1f} ms; "
            f"the TTFT went to {parts}")
    worst = done.nlargest(slowest, "ttft_ms")
    return "\n\n".join([head, *(explain_request(row, policy) for _, row in worst.iterrows())])
