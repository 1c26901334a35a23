"""Step latency models: how long one engine step of a given shape takes."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sim.core.plan import StepShape
from sim.latency.fixed import FixedLatency
from sim.latency.roofline import RooflineLatency
from sim.latency.table import TableLatency


@runtime_checkable
class LatencyModel(Protocol):
    """Anything the simulator can ask for the duration of one step."""

    name: str

    def step_time(self, shape: StepShape) -> float:
        """Seconds the step takes, from launch to tokens available."""
        ...


__all__ = ["FixedLatency", "LatencyModel", "RooflineLatency", "TableLatency"]
