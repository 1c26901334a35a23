"""Config and pricing values that are NamedTuples (cheap to import and build): the files
and copies made from them stay as they were with dataclasses."""

from __future__ import annotations

import json

import pytest

from sim.core.schedulers import SchedulerSettings
from sim.world.replica import ReplicaSetup


def test_a_replay_plan_writes_its_scheduler_settings_as_an_object() -> None:
    pytest.importorskip("torch")
    from calibrate.gpu.plain_replay import ReplayPlan
    from gpu_engine.sampling import SamplingParams

    settings = SchedulerSettings(max_num_seqs=8, speculative_tokens=2)
    plan = ReplayPlan("p", "tiny", 0, "float32", 16, 64, 0.0, False, "continuous", settings,
                      SamplingParams(), ((0, 0.0, 5, 3),), {"model": "tiny"})
    body = json.loads(plan.to_json())
    assert body["scheduler"] == settings._asdict()
    assert ReplayPlan.from_json(plan.to_json()) == plan


def test_setups_and_settings_copy_with_one_field_changed() -> None:
    settings = SchedulerSettings()
    assert settings._replace(speculative_tokens=3) == SchedulerSettings(speculative_tokens=3)
    setup = ReplicaSetup(None, None, None)  # type: ignore[arg-type]
    assert setup._replace(observer="o").observer == "o" and setup.observer is None
