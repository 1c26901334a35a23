"""The simulator on the engine's own step times: the world checked without the machine.

An engine replay records every step's shape and duration (`Engine.steps`,
`engine_steps.csv`). Fed those durations in order, the simulator must make
the same plans and put every request on the same timestamps, to the last
bit: both run the same scheduler, and the engine keeps its time the way
SimPy does (a step after an idle wait starts at the arrival or wakeup it
waited for, a step ends at start + duration, arrivals are the previous
arrival + the gap). That check needs no quiet machine, so it can gate; and
it is why a fidelity report's request-level errors are the table's step
errors and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpu_engine.engine import StepLog
from sim.assemble import build_replica, kv_budget
from sim.config.scenario import Scenario
from sim.core.plan import StepPlan, StepResult, StepShape
from sim.results.record.recorder import RunRecorder
from sim.workload import make_requests
from sim.world.fleet import simulate_fleet
from sim.world.replica import ReplicaSetup


class Diverged(RuntimeError):
    """The simulator asked for a step the engine never ran: the two worlds disagree."""


@dataclass(slots=True)
class RecordedSteps:
    """A latency model that answers the i-th step with the engine's i-th measured duration.

    It refuses a shape other than the one the engine ran at that position, and
    hands speculative steps the engine's own emitted counts, so a divergence is
    caught at the first step where it happens.
    """

    steps: Sequence[StepLog]
    name: str = "the engine's recorded step times"
    _next: int = field(default=0, init=False)

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        if self._next >= len(self.steps):
            raise Diverged(f"the simulator ran a step {self._next + 1} ({shape}); the engine "
                           f"ran {len(self.steps)}")
        log = self.steps[self._next]
        if shape != log.shape:
            raise Diverged(f"step {self._next + 1}: the simulator planned {shape}, the engine "
                           f"ran {log.shape}")
        self._next += 1
        return log.duration_s + moved_s if moved_s else log.duration_s

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        """Recorded times answer step by step only (resimulate turns fast-forward off)."""
        raise Diverged("the engine's recorded step times are replayed one step at a time")

    def emitted(self, _plan: StepPlan) -> StepResult:
        """What the step just priced emitted per sequence on the engine (speculation)."""
        return StepResult((), self.steps[self._next - 1].num_emitted)

    @property
    def unused(self) -> int:
        return len(self.steps) - self._next


def resimulate(scenario: Scenario, base_dir: Path | None, steps: Sequence[StepLog]
               ) -> RunRecorder:
    """Simulate `scenario`'s requests with the engine's recorded `steps` as step times.

    Raises `Diverged` where a plan differs or the step counts do not match.
    """
    return resimulate_setup(scenario, base_dir, steps).recorder


def resimulate_setup(scenario: Scenario, base_dir: Path | None, steps: Sequence[StepLog]
                     ) -> ReplicaSetup:
    """`resimulate`, keeping the replica it ran (its recorder, scheduler and KV pool)."""
    replica = build_replica(scenario, kv_budget(scenario))
    latency = RecordedSteps(steps)
    recorder = RunRecorder()
    speculate = latency.emitted if scenario.speculative.num_tokens else None
    # one recorded time per step, in order: the step-by-step world
    setup = ReplicaSetup(replica.scheduler, latency, recorder, replica.kv, speculate,
                         fast_forward=False, links=replica.links)
    simulate_fleet(make_requests(scenario.workload, scenario.seed, base_dir), [setup], None,
                   None, recorder)
    if latency.unused:
        raise Diverged(f"the engine ran {len(steps)} steps, the simulator "
                       f"{len(steps) - latency.unused}")
    return setup
