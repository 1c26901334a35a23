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
  the running set without tokens (chunked interleaving);
- outside the engine's steps: `frontend`, the serving frontend's time before the
  engine has the request (API server, tokenization) and after its first token's
  step (the async output lag, detokenization, the stream write).
A shared step's duration is split in proportion to the tokens each sequence
computes in it (a chunk counts its tokens, a decode one per position); padded
tokens and slots belong to no one and fall to `shared`. Why tokens: the linear
layers, which dominate prefill steps, scale with them, and the rule needs
nothing from the latency model, so it holds for calibrated tables too.

`prefix_saved` estimates the time the cached prefix tokens did not cost: the
latency model's time for the whole prompt alone minus the uncached part after
the cached context. It is reported apart and is not part of the sum.

Columns (ms) in requests.csv: ttft_queue_ms, ttft_batch_fill_ms, ttft_kv_wait_ms,
ttft_prefill_ms, ttft_shared_ms, ttft_preempt_ms, prefix_saved_ms; sim.observe.explain
reads them back and puts them in plain words. Python work per step
is O(prefilling sequences) plus two C-level passes over the plan's columns; nothing is
kept per step, and state lives only for requests between arrival and first token.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING

import numpy as np

from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.observe.trace import WaitClock

if TYPE_CHECKING:
    import pandas as pd

# the parts, in the order they are printed; they sum to ttft_ms
TTFT_PARTS = ("ttft_queue_ms", "ttft_batch_fill_ms", "ttft_kv_wait_ms", "ttft_prefill_ms",
              "ttft_shared_ms", "ttft_preempt_ms", "ttft_frontend_ms")
# context for the words: requests waiting ahead and running at its arrival, its prefill
# steps and the other sequences sharing them on average
_FLOAT_COLUMNS = (*TTFT_PARTS, "prefix_saved_ms", "mean_others_in_prefill")
_INT_COLUMNS = ("queue_ahead", "running_at_arrival", "prefill_steps")
COLUMNS = (*_FLOAT_COLUMNS, *_INT_COLUMNS)  # a row's values, in this order (after request_id)


@dataclass(slots=True, eq=False)
class _Pending:
    """One request between arrival and first token (seconds; -1.0 = not yet)."""

    arrival_s: float
    idle0_s: float
    kv0_s: float
    ahead: int
    running: int
    prompt: int
    in_s: float = 0.0  # the frontend's input terms: client send to engine arrival
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


# what a request's arrival left: engine arrival, idle clock, KV clock (s); queue ahead,
# running at arrival, prompt tokens; the frontend's input time (s) (a _Pending's first seven)
_Arrived = tuple[float, float, float, int, int, int, float]


class _Waiting:
    """Arrived requests not yet admitted, as typed columns in arrival order: 56 B of readings
    a request, instead of a `_Pending` object and a map entry. Why: at overload the queue
    holds most of a run's requests, and each waits here until its first admission.

    Requests arrive with rising ids and are first admitted in arrival order (FCFS), so a
    record is found by bisection from the head and is usually the head. One taken out of
    order moves those before it to a map (e.g. an aborted request's, which nobody takes),
    as does one arriving with a lower id than the last; the columns are cut at the head.
    """

    __slots__ = ("_head", "_rids", "_floats", "_ints", "_aside")

    def __init__(self) -> None:
        self._head = 0  # the oldest record still waiting
        self._rids = array("q")  # ascending
        self._floats = array("d")  # arrival, idle clock, KV clock, frontend in; 4 a record
        self._ints = array("q")  # queue ahead, running at arrival, prompt tokens; 3 a record
        self._aside: dict[int, _Arrived] = {}

    def __len__(self) -> int:
        return len(self._rids) - self._head + len(self._aside)

    def add(self, rid: int, arrival_s: float, idle0_s: float, kv0_s: float, ahead: int,
            running: int, prompt: int, in_s: float) -> None:
        rids = self._rids
        if len(rids) > self._head and rid <= rids[-1]:
            self._aside[rid] = (arrival_s, idle0_s, kv0_s, ahead, running, prompt, in_s)
            return
        rids.append(rid)
        self._floats.extend((arrival_s, idle0_s, kv0_s, in_s))
        self._ints.extend((ahead, running, prompt))

    def pop(self, rid: int) -> _Arrived | None:
        """Request `rid`'s record, forgotten here; None if it is not waiting."""
        if self._aside and rid in self._aside:
            return self._aside.pop(rid)
        rids, head = self._rids, self._head
        at = head if head < len(rids) and rids[head] == rid else bisect_left(rids, rid, head)
        if at == len(rids) or rids[at] != rid:
            return None
        for i in range(head, at):
            self._aside[rids[i]] = self._record(i)
        record = self._record(at)
        self._head = at + 1
        if 2 * self._head > len(rids) > 1024:
            del rids[:self._head], self._floats[:4 * self._head], self._ints[:3 * self._head]
            self._head = 0
        return record

    def _record(self, i: int) -> _Arrived:
        f, n, j, k = self._floats, self._ints, 3 * i, 4 * i
        return f[k], f[k + 1], f[k + 2], n[j], n[j + 1], n[j + 2], f[k + 3]


class TTFTDiagnoser:
    """Accumulates the TTFT parts of every request of one replica (see the module docstring)."""

    __slots__ = ("clock", "scheduler", "step_time", "_waiting", "_pending", "_floats", "_ints",
                 "_ready", "delivery_s")

    def __init__(self, clock: WaitClock, scheduler: Scheduler,
                 step_time: Callable[[StepShape], float], hand_off: bool = False,
                 delivery_s: Callable[[StepShape], float] | None = None) -> None:
        """`hand_off`: each row waits in memory only until `take` collects it (a streamed
        requests.csv); else every row is kept for `frame`. `delivery_s`: how long after a
        step's GPU time its tokens reach the client (the async output lag and the
        frontend's output terms; None: at once)."""
        self.delivery_s = delivery_s
        self.clock = clock
        self.scheduler = scheduler
        self.step_time = step_time
        self._waiting = _Waiting()  # arrived, not yet admitted
        self._pending: dict[int, _Pending] = {}  # admitted, before the first token
        self._ready: dict[int, tuple[float | int, ...]] | None = {} if hand_off else None
        # kept rows (without hand_off): _FLOAT_COLUMNS' values, then request_id and
        # _INT_COLUMNS' values, a row after another
        self._floats, self._ints = array("d"), array("q")

    def on_arrival(self, request: Request, now_s: float) -> None:
        idle_s, kv_s = self.clock.at(now_s)
        sched = self.scheduler
        self._waiting.add(request.request_id, now_s, idle_s, kv_s, sched.num_waiting - 1,
                          sched.num_running, request.prompt_tokens, now_s - request.arrival_s)

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        pending, waiting = self._pending, self._waiting
        if not pending and not waiting:
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
        out_s = self.delivery_s(shape) if self.delivery_s is not None else 0.0
        for i in compress(range(len(news)), plan.is_prefill):
            rid = plan.request_ids[i]
            p = pending.get(rid)
            new, context = news[i], contexts[i]
            if p is None:
                arrived = waiting.pop(rid)
                if arrived is None:
                    continue  # past its first token (a re-prefill after preemption)
                if emits[i]:  # admitted and first token in this step: nothing kept between
                    self._at_once(rid, arrived, start_s, start_s + duration_s, new, context,
                                  per_token_s, others, out_s)
                    continue
                p = pending[rid] = _Pending(*arrived)
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
                self._finish(plan.request_ids[i], p, start_s + duration_s, out_s)

    def _admitted(self, p: _Pending, start_s: float, context: int) -> None:
        idle_s, kv_s = self.clock.at(start_s)
        p.admit_s = start_s
        p.idle_wait_s = idle_s - p.idle0_s
        p.kv_wait_s = kv_s - p.kv0_s
        p.computed_max = context  # served by the prefix cache
        if context:
            p.saved_s = self._saved_s(p.prompt, context)

    def _saved_s(self, prompt: int, context: int) -> float:
        """The time the `context` cached prompt tokens did not cost (see the module)."""
        whole = self.step_time(StepShape(prefill_chunk_tokens=(prompt,),
                                         prefill_context_tokens=(0,), padded_batch=1))
        rest = self.step_time(StepShape(prefill_chunk_tokens=(prompt - context,),
                                        prefill_context_tokens=(context,), padded_batch=1))
        return max(0.0, whole - rest)

    def _at_once(self, rid: int, arrived: _Arrived, start_s: float, first_token_s: float,
                 new: int, context: int, per_token_s: float, others: int, out_s: float
                 ) -> None:
        """A request first admitted in the step that gives its first token (most are): the
        row on_step and _finish would give through a _Pending, the same floats."""
        arrival_s, idle0_s, kv0_s, ahead, running, prompt, in_s = arrived
        idle_s, kv_s = self.clock.at(start_s)
        saved_s = self._saved_s(prompt, context) if context else 0.0
        # a fresh record's sums (0.0) plus this step's shares: nothing to recompute
        self._row(rid, arrival_s, start_s, idle_s - idle0_s, kv_s - kv0_s,
                  0.0 + new * per_token_s, 0.0 + 0 * per_token_s, 0.0, saved_s, 0 + others, 1,
                  ahead, running, first_token_s, in_s + out_s)

    def _finish(self, rid: int, p: _Pending, first_token_s: float, out_s: float) -> None:
        del self._pending[rid]
        self._row(rid, p.arrival_s, p.admit_s, p.idle_wait_s, p.kv_wait_s, p.own_s,
                  p.recompute_s, p.preempt_s, p.saved_s, p.others, p.steps, p.ahead, p.running,
                  first_token_s, p.in_s + out_s)

    def _row(self, rid: int, arrival_s: float, admit_s: float, idle_wait_s: float,
             kv_wait_s: float, own_s: float, recompute_s: float, preempt_s: float,
             saved_s: float, others: int, steps: int, ahead: int, running: int,
             first_token_s: float, frontend_s: float) -> None:
        """Request `rid`'s row (COLUMNS' values) from its sums, handed off or kept."""
        wait_s = admit_s - arrival_s
        running_s = first_token_s - admit_s
        floats = ((wait_s - idle_wait_s - kv_wait_s) * 1e3, idle_wait_s * 1e3, kv_wait_s * 1e3,
                  own_s * 1e3, (running_s - own_s - recompute_s - preempt_s) * 1e3,
                  (preempt_s + recompute_s) * 1e3, frontend_s * 1e3, saved_s * 1e3,
                  others / steps)
        if self._ready is not None:
            self._ready[rid] = (*floats, ahead, running, steps)
            return
        self._floats.extend(floats)
        self._ints.extend((rid, ahead, running, steps))

    def take(self, rid: int) -> tuple[float | int, ...] | None:
        """Request `rid`'s row (COLUMNS' values), forgotten once taken; None if it has none
        (rejected before its first token, or another replica's). Only with `hand_off`."""
        assert self._ready is not None
        return self._ready.pop(rid, None)

    def frame(self) -> pd.DataFrame:
        """One row per request that reached its first token, keyed by request_id."""
        import pandas as pd  # only a caller that wants the frame pays for pandas

        floats = np.array(self._floats, dtype=np.float64).reshape(-1, len(_FLOAT_COLUMNS))
        ints = np.array(self._ints, dtype=np.int64).reshape(-1, 1 + len(_INT_COLUMNS))
        columns = {"request_id": ints[:, 0]}
        columns.update({k: floats[:, j] for j, k in enumerate(_FLOAT_COLUMNS)})
        columns.update({k: ints[:, 1 + j] for j, k in enumerate(_INT_COLUMNS)})
        return pd.DataFrame(columns)
