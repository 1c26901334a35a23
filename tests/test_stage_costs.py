"""benchmarks/stage_costs.py: a stage's own time leaves out the stages it calls, and every
stage it names is a method the simulator has."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from stage_costs import STAGES, Stages  # noqa: E402


def test_own_time_leaves_out_the_stages_called() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    stages = Stages(("outer", "inner"), clock)

    def inner() -> str:
        now[0] += 2.0
        return "inner"

    timed_inner = stages.wrap("inner", inner)

    def outer() -> list[str]:
        now[0] += 1.0
        got = [timed_inner(), timed_inner()]
        now[0] += 3.0
        return got

    assert stages.wrap("outer", outer)() == ["inner", "inner"]
    assert stages.own_s == {"outer": 4.0, "inner": 4.0}  # 8 s in all, 4 of them inner's
    assert stages.calls == {"outer": 1, "inner": 2}
    assert stages.running == []


def test_an_exception_still_counts_and_unwinds() -> None:
    now = [0.0]
    stages = Stages(("outer", "inner"), lambda: now[0])

    def failing() -> None:
        now[0] += 5.0
        raise ValueError("no")

    timed = stages.wrap("inner", failing)

    def outer() -> None:
        try:
            timed()
        except ValueError:
            now[0] += 1.0

    stages.wrap("outer", outer)()
    assert stages.own_s == {"outer": 1.0, "inner": 5.0} and stages.running == []


def test_every_stage_is_a_method_of_the_simulator() -> None:
    for name, module, cls, method in STAGES:
        assert callable(getattr(getattr(importlib.import_module(module), cls), method)), name
