"""sim.core.drive keeps the SimPy world's time: same arrivals and step times, same plans and
timestamps, float for float; and it refuses to spin when a scheduler livelocks."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.loader import validate_scenario
from sim.core.contiguous import ContiguousAllocator
from sim.core.drive import default_step_s, run_steps
from sim.core.kv import PagedBlockManager
from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request
from sim.core.schedulers import ContinuousScheduler, DynamicScheduler, StaticScheduler
from sim.latency.runs import each_step_s
from sim.results.record.recorder import RunRecorder
from sim.workload import make_requests
from sim.world.fleet import simulate


class PlanLog:
    """A latency model that keeps every plan's shape it priced, in order."""

    name = "default_step_s"

    def __init__(self) -> None:
        self.shapes: list[StepShape] = []

    def step_time(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return default_step_s(shape)

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        return each_step_s(default_step_s, shape, steps)  # priced, not logged


def requests(seed: int) -> list[Request]:
    sc = validate_scenario({"seed": seed, "workload": {
        "arrivals": {"process": "poisson", "rate": 40.0},
        "prompt_tokens": {"dist": "uniform", "low": 4, "high": 300},
        "output_tokens": {"dist": "uniform", "low": 1, "high": 40},
        "num_requests": 120}}, "test")
    return list(make_requests(sc.workload, sc.seed))


SCHEDULERS = {
    "continuous-preempting": lambda: ContinuousScheduler(PagedBlockManager(60, 8), 16, 256),
    "static": lambda: StaticScheduler(ContiguousAllocator(400, 8), 6, max_model_len=400),
    "dynamic": lambda: DynamicScheduler(ContiguousAllocator(400, 8), 6, 0.03,
                                        max_model_len=400),
}


@pytest.mark.parametrize("policy", SCHEDULERS)
def test_the_driver_and_the_simpy_world_agree_float_for_float(policy: str) -> None:
    ours, theirs = requests(3), requests(3)
    _, plans = run_steps(SCHEDULERS[policy](), ours)
    latency = PlanLog()
    simulate(theirs, SCHEDULERS[policy](), latency, RunRecorder(), fast_forward=False)
    assert [p.shape for p in plans] == latency.shapes and len(plans) > 50
    if policy.startswith("continuous"):
        assert any(p.preempted_ids for p in plans), "the pool must be small enough to preempt"
    stamps = [(r.first_scheduled_s, r.first_token_s, r.finish_s) for r in ours]
    assert stamps == [(r.first_scheduled_s, r.first_token_s, r.finish_s) for r in theirs]
    forwarded = requests(3)  # decode runs as single events: the same instants
    simulate(forwarded, SCHEDULERS[policy](), PlanLog(), RunRecorder())
    assert stamps == [(r.first_scheduled_s, r.first_token_s, r.finish_s) for r in forwarded]


class Stuck:
    """A scheduler with work it never schedules: the driver must say so, not spin."""

    num_waiting = num_running = kv_blocks_used = kv_slots_held = 0

    def __init__(self, wakeup: float | None) -> None:
        self.wakeup = wakeup

    def add(self, request: Request, now: float) -> bool:
        return True

    def schedule(self, now: float) -> StepPlan | None:
        return None

    def next_wakeup(self, now: float) -> float | None:
        return self.wakeup

    def close(self, now: float) -> None:
        pass

    def has_unfinished(self) -> bool:
        return True


@pytest.mark.parametrize("wakeup", [None, 0.0], ids=["no-wakeup", "wakeup-in-the-past"])
def test_a_livelocked_scheduler_is_an_error(wakeup: float | None) -> None:
    with pytest.raises(RuntimeError, match="livelock"):
        run_steps(Stuck(wakeup), [Request(0, 0.0, 4, 2)])  # type: ignore[arg-type]
