"""The step driver: the step contract's loop (arrivals, steps, idle waits) without SimPy.

It keeps time exactly as the SimPy world does (sim.world), so a world driven
here makes the simulator's plans for the same arrivals and step durations,
float for float:
- an arrival instant is the previous one plus its gap, as SimPy adds timeouts;
- arrivals that happen by the end of a step are added, each at its own
  instant, before the scheduler learns the step's result, and are seen by the
  next schedule();
- close() follows the last arrival, at its instant;
- an idle world waits for the next arrival or the scheduler's wakeup, and the
  step after the wait starts at that instant.

The driver never reads a clock: a step reports when it ended (a virtual clock:
start + a predicted duration; the engine on the wall clock: what it measured),
and `wait_until` lets a wall-clock world sleep until an arrival. The engine's
replay (gpu_engine.replay_loop) and the tests (`run_steps`) drive through here.

It is synchronous: schedule() and on_step_done() alternate, one step at a time.
KV moves the scheduler issues (swaps, offload-tier loads, `take_transfers`) land at once,
free: the real engine moves no KV between tiers, and a test driver has no links.
A scheduler built with `async_scheduling` (vLLM's default, the continuous
policy's unless the scenario says false) never gets a plan scheduled ahead here,
so the real engine runs synchronously whatever its scenario asks: its plans are
vLLM's AsyncScheduler's driven step by step, which are the synchronous
scheduler's but that blocks filled by accepted drafts are named (prefix cache)
when their step is applied rather than at the next schedule().
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler

# step(start_s, admit_until): schedule at start_s; if there is a plan, run it, call
# admit_until(end_s) before on_step_done, apply it and return end_s; else return None
Step = Callable[[float, Callable[[float], None]], float | None]
EMPTY = StepResult()  # a scripted step: no token values, one token per emitting sequence


def drive(scheduler: Scheduler, requests: Iterable[Request], step: Step,
          add: Callable[[Request, float], bool] | None = None,
          on_rejected: Callable[[Request], None] | None = None,
          wait_until: Callable[[float], None] | None = None) -> float:
    """Serve `requests` (in arrival order) to the end; returns the end time in seconds.

    `add(request, at_s)` queues an arrival (default: the scheduler's add), False
    when it was rejected (then `on_rejected(request)`). Raises RuntimeError when
    the scheduler livelocks: nothing runnable, no wakeup ahead, work left.
    """
    pending = iter(requests)
    upcoming: list[Request] = []  # at most one request read ahead
    queue = scheduler.add if add is None else add
    arrived_s = 0.0  # the last arrival's instant, as SimPy reckons it
    closed = False

    def next_arrival() -> Request | None:
        if not upcoming:
            nxt = next(pending, None)
            if nxt is None:
                return None
            upcoming.append(nxt)
        return upcoming[0]

    def admit_until(t_s: float) -> None:
        nonlocal arrived_s, closed
        while (req := next_arrival()) is not None:
            gap_s = req.arrival_s - arrived_s
            at_s = arrived_s + gap_s if gap_s > 0 else arrived_s  # as SimPy adds it
            if at_s > t_s:
                return
            upcoming.pop()
            arrived_s = at_s
            if not queue(req, at_s) and on_rejected is not None:
                on_rejected(req)
        if not closed:
            closed = True
            scheduler.close(arrived_s)

    take_moves = getattr(scheduler, "take_transfers", None)

    def land_moves() -> bool:
        """The KV moves the scheduler issued (swaps, offload-tier loads) land at once: this
        driver has no links to price them on (the SimPy world does, sim.world.link_sim)."""
        moves = take_moves() if take_moves is not None else ()
        for move in moves:
            scheduler.kv_landed(move, 0.0)  # type: ignore[attr-defined]
        return bool(moves)

    now_s = 0.0
    idle_at_s: float | None = None  # the instant the last idle wait began
    admit_until(now_s)
    while True:
        end_s = step(now_s, admit_until)
        landed = land_moves()
        if end_s is not None:
            now_s = end_s
            continue
        if landed:  # an async load held the only work: it can run now
            continue
        nxt = next_arrival()
        wakeup_s = scheduler.next_wakeup(now_s)
        if nxt is None and wakeup_s is None:
            if not closed:
                admit_until(now_s)
                continue
            if scheduler.has_unfinished():
                raise RuntimeError(f"scheduler livelock at {now_s} s: nothing runnable, "
                                   "no wakeup ahead, requests unfinished")
            return now_s
        targets = [] if wakeup_s is None else [now_s + max(0.0, wakeup_s - now_s)]
        if nxt is not None:  # as SimPy adds the gap to the last arrival
            targets.append(arrived_s + max(0.0, nxt.arrival_s - arrived_s))
        target_s = min(targets)
        if target_s <= now_s and idle_at_s == now_s:
            raise RuntimeError(f"scheduler livelock at {now_s} s: woken with nothing to run")
        idle_at_s, now_s = now_s, target_s
        if wait_until is not None:
            wait_until(now_s)
        admit_until(now_s)


def default_step_s(shape: StepShape) -> float:
    """A step time for tests: 10 ms plus 10 us per token."""
    return 0.01 + 1e-5 * shape.num_tokens


def run_steps(scheduler: Scheduler, requests: Iterable[Request],
              step_s: Callable[[StepShape], float] = default_step_s,
              check: Callable[[StepPlan, float], None] | None = None,
              after: Callable[[], None] | None = None,
              result: Callable[[StepPlan], StepResult] | None = None,
              max_steps: int = 200_000) -> tuple[list[Request], list[StepPlan]]:
    """A virtual clock: each step lasts `step_s(plan.shape)`. Runs to the end.

    Returns the requests in the order they finished or were rejected, and every
    plan. `check(plan, start_s)` sees each plan before it is applied, `after()`
    runs after each step (tests check the pool's invariants there), `result(plan)`
    says what the step emitted (default: one token per emitting sequence).
    """
    done: list[Request] = []
    plans: list[StepPlan] = []

    def step(start_s: float, admit_until: Callable[[float], None]) -> float | None:
        plan = scheduler.schedule(start_s)
        if plan is None:
            return None
        plans.append(plan)
        if check is not None:
            check(plan, start_s)
        end_s = start_s + step_s(plan.shape)
        admit_until(end_s)
        done.extend(scheduler.on_step_done(plan, EMPTY if result is None else result(plan),
                                           end_s))
        if after is not None:
            after()
        if len(plans) >= max_steps:
            raise RuntimeError(f"the run did not end within {max_steps} steps")
        return end_s

    drive(scheduler, sorted(requests, key=lambda r: r.arrival_s), step,
          on_rejected=done.append)
    return done, plans
