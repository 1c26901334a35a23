"""The clock-free step loop both parity sides run, and the record it keeps of each step.

A side wraps one scheduler (vLLM's or servesim's) behind `Side`. The loop adds
the requests whose arrival step has come, asks for a step, applies it (every
request that completed its known tokens emits one token, or with drafts 1 +
configs.accepted_drafts of them) and records what was decided. A step that
schedules nothing and preempts no one leaves the state as it was, so the
loop jumps to the next arrival; with none left that is a
livelock and the run stops with an error. Both sides therefore number their
steps identically as long as their decisions agree.

`run_config_async` drives a side as vLLM's engine core drives an async scheduler
(`EngineCore.step_with_batch_queue`, a batch queue of two): schedule(0),
schedule(1), apply(0), schedule(2), apply(1), ... so step n + 1 is scheduled
while step n runs. A step is recorded when it is applied (its finished ids are
known then), numbered by its schedule() call; arrivals are added before each
schedule(). A schedule() that neither schedules nor preempts while no step runs
leaves the state as it was: the queued empty steps are applied and the loop jumps
to the next arrival, as the synchronous loop does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from parity.configs import ParityConfig, RequestSpec

MAX_STEPS = 200_000


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one schedule() decided: decisions, not block ids.

    `scheduled`: (request id, tokens) in the scheduler's order; `admitted`:
    (request id, prefix-hit tokens) for each request admitted this step (new or
    resumed); `free_blocks`: free KV blocks right after scheduling (cached but
    unreferenced blocks count as free, as in both pools); `drafts`: (request id,
    draft tokens among its scheduled ones) for each that verifies drafts, in the
    scheduler's order.
    """

    step: int
    scheduled: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    admitted: tuple[tuple[int, int], ...]
    free_blocks: int
    drafts: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> list:
        return [self.step, [list(x) for x in self.scheduled], list(self.preempted),
                list(self.finished), [list(x) for x in self.admitted], self.free_blocks,
                [list(x) for x in self.drafts]]

    @classmethod
    def from_json(cls, row: list) -> StepRecord:
        step, scheduled, preempted, finished, admitted, free, drafts = row
        return cls(step, tuple((a, b) for a, b in scheduled), tuple(preempted),
                   tuple(finished), tuple((a, b) for a, b in admitted), free,
                   tuple((a, b) for a, b in drafts))


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A side's answer to one schedule() call (see StepRecord for the fields)."""

    scheduled: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    admitted: tuple[tuple[int, int], ...]
    free_blocks: int
    drafts: tuple[tuple[int, int], ...] = ()


class Side(Protocol):
    def add(self, spec: RequestSpec) -> None: ...

    def schedule(self) -> Scheduled: ...

    def step_done(self) -> list[int]:
        """Apply the oldest schedule() not yet applied (synchronously: the last one): tokens
        for each request that caught up; finished ids."""
        ...

    def has_unfinished(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RunResult:
    name: str
    digest: str
    steps: tuple[StepRecord, ...]
    error: str | None = None


def run_config(config: ParityConfig, side: Side, max_steps: int = MAX_STEPS) -> RunResult:
    """Drive `side` through `config`'s arrivals until every request finished."""
    pending = sorted(config.requests, key=lambda r: (r.arrival_step, r.request_id))
    records: list[StepRecord] = []
    step, i = 0, 0
    error = None
    try:
        while True:
            while i < len(pending) and pending[i].arrival_step <= step:
                side.add(pending[i])
                i += 1
            if not side.has_unfinished():
                if i == len(pending):
                    break
                step = pending[i].arrival_step
                continue
            out = side.schedule()
            finished = side.step_done()
            records.append(StepRecord(step, out.scheduled, tuple(sorted(out.preempted)),
                                      tuple(sorted(finished)), out.admitted, out.free_blocks,
                                      out.drafts))
            if not out.scheduled and not out.preempted:
                if i == len(pending):
                    error = f"livelock at step {step}: nothing runnable, requests left"
                    break
                step = pending[i].arrival_step
                continue
            step += 1
            if len(records) >= max_steps:
                error = f"no end after {max_steps} steps"
                break
    except Exception as exc:  # a side that breaks is a recorded result, not a crash
        error = f"{type(exc).__name__}: {exc}"
    return RunResult(config.name, config.digest, tuple(records), error)


BATCH_QUEUE = 2  # vLLM's engine core with async scheduling: one step runs, the next is queued


def run_config_async(config: ParityConfig, side: Side, max_steps: int = MAX_STEPS) -> RunResult:
    """Drive `side` through `config`'s arrivals as vLLM's async engine core: one step ahead."""
    pending = sorted(config.requests, key=lambda r: (r.arrival_step, r.request_id))
    records: list[StepRecord] = []
    queue: deque[tuple[int, Scheduled]] = deque()  # scheduled, not applied: oldest first
    step, i = 0, 0
    error = None

    def apply_oldest() -> None:
        at, out = queue.popleft()
        finished = side.step_done()
        records.append(StepRecord(at, out.scheduled, tuple(sorted(out.preempted)),
                                  tuple(sorted(finished)), out.admitted, out.free_blocks,
                                  out.drafts))

    try:
        while True:
            while i < len(pending) and pending[i].arrival_step <= step:
                side.add(pending[i])
                i += 1
            if side.has_unfinished():
                out = side.schedule()
                running = any(o.scheduled for _, o in queue)
                queue.append((step, out))
                if not out.scheduled and not out.preempted and not running:
                    while queue:
                        apply_oldest()
                    if i == len(pending):
                        error = f"livelock at step {step}: nothing runnable, requests left"
                        break
                    step = pending[i].arrival_step
                    continue
                step += 1
                if len(queue) < BATCH_QUEUE:
                    continue
            elif not queue:
                if i == len(pending):
                    break
                step = pending[i].arrival_step
                continue
            apply_oldest()
            if len(records) >= max_steps:
                error = f"no end after {max_steps} steps"
                break
    except Exception as exc:  # a side that breaks is a recorded result, not a crash
        error = f"{type(exc).__name__}: {exc}"
    return RunResult(config.name, config.digest, tuple(records), error)
