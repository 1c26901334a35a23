"""A virtual-clock driver for any scheduler: the step contract without SimPy.

Arrivals up to `now` are added, then schedule(); a None plan sleeps until the
next arrival or next_wakeup(); close() is called once after the last add().
"""

from __future__ import annotations

from collections.abc import Callable

from sim.core.plan import StepPlan, StepResult, StepShape
from sim.core.request import Request
from sim.core.schedulers import Scheduler


def drive(sched: Scheduler, requests: list[Request],
          step_s: Callable[[StepShape], float] = lambda s: 0.01 + 1e-5 * s.num_tokens,
          check: Callable[[StepPlan, float], None] | None = None, max_steps: int = 200_000,
          ) -> tuple[list[Request], list[StepPlan]]:
    """Run to idle; returns requests in the order they finished or were rejected, and plans.

    `check(plan, now)` sees each plan right after schedule(), before it is applied.
    """
    pending = sorted(requests, key=lambda r: r.arrival_s)
    now, i, done, plans, closed = 0.0, 0, [], [], False
    idle_at = None  # when schedule() last returned None: twice at one instant is a livelock
    while True:
        while i < len(pending) and pending[i].arrival_s <= now:
            if not sched.add(pending[i], now):
                done.append(pending[i])
            i += 1
        if i == len(pending) and not closed:
            sched.close(now)
            closed = True
        plan = sched.schedule(now)
        if plan is None:
            wakes = [t for t in (sched.next_wakeup(now),) if t is not None]
            if i < len(pending):
                wakes.append(pending[i].arrival_s)
            if not wakes:
                assert not sched.has_unfinished(), "nothing runnable with work left: livelock"
                return done, plans
            assert idle_at != now, f"woken at {now} with nothing to run: livelock"
            idle_at, now = now, max(now, min(wakes))
            continue
        plans.append(plan)
        if check is not None:
            check(plan, now)
        now += step_s(plan.shape)
        done += sched.on_step_done(plan, StepResult(), now)
        sched.kv.check_invariants()
        assert len(plans) < max_steps, "run did not end"
