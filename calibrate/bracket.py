"""Profile and validate in one run, the replay bracketed by the profile's passes.

On a shared machine the speed drifts by tens of percent over seconds to minutes,
so a table profiled at one time and a replay run at another differ by the drift,
not by the model. Here the replay runs between the middle two passes of the
profile, and every point's samples average the passes before and after it: the
table sees the machine as the replay saw it, give or take the drift within the
run. `servesim calibrate profile ... --validate SCENARIO` runs this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from calibrate.fit import FitReport, fit_table
from calibrate.profile import ProfileResult, ProfileSettings, profile_engine
from calibrate.validate import EngineReplay, Fidelity, compare, run_engine
from sim.scenario import Scenario
from sim.specs import get_model


@dataclass(frozen=True, slots=True)
class Bracketed:
    profile: ProfileResult
    fit: FitReport
    fidelity: Fidelity


def bracket_problems(settings: ProfileSettings, scenario: Scenario) -> list[str]:
    """Why `scenario` cannot be validated against this profile ('field: ...' messages)."""
    out = []
    if settings.num_passes < 2:
        out.append(f"passes: bracketing a replay needs at least 2 passes, got "
                   f"{settings.num_passes}")
    profiled = dataclasses.replace(get_model(settings.model), name=scenario.model_spec.name)
    if scenario.model_spec != profiled:
        out.append(f"model: the scenario runs {scenario.model_spec.name}, the profile "
                   f"{settings.model}")
    if scenario.kv.block_size != settings.block_size:
        out.append(f"block_size: the scenario uses kv.block_size {scenario.kv.block_size}, "
                   f"the profile {settings.block_size}")
    return out


def profile_and_validate(settings: ProfileSettings, out_dir: str | Path, scenario: Scenario,
                         base_dir: Path | None, show_progress: bool = True) -> Bracketed:
    """Profile into `out_dir` with the scenario replayed after pass passes // 2, fit, compare."""
    problems = bracket_problems(settings, scenario)
    if problems:
        raise ValueError("; ".join(problems))
    replays: list[EngineReplay] = []
    middle = settings.num_passes // 2

    def replay(finished_pass: int) -> None:
        if finished_pass == middle:
            replays.append(run_engine(scenario, base_dir, settings.device, settings.threads,
                                      settings.clock, show_progress))

    result = profile_engine(settings, out_dir, show_progress, between_passes=replay)
    if not replays:
        raise RuntimeError("the budget ran out before the replay's pass; raise --budget-s")
    report = fit_table(out_dir)
    fidelity = compare(scenario, base_dir, out_dir, replays[0])
    where = f"between passes {middle} and {middle + 1} of the profile's {settings.num_passes}"
    return Bracketed(result, report, dataclasses.replace(
        fidelity, info={**fidelity.info, "bracketed": where}))
