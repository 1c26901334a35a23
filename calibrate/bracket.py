"""Profile and validate in one run, the replay bracketed by the profile's passes.

On a shared machine the speed drifts by tens of percent over seconds to minutes,
so a table profiled at one time and a replay run at another differ by the drift,
not by the model. Here the replay runs between the middle two passes of the
profile, and every point's samples average the passes before and after it: the
table sees the machine as the replay saw it, give or take the drift within the
run. Several scenarios replay between consecutive passes around the middle
(one pass more than scenarios is needed). `servesim calibrate profile ...
--validate SCENARIO [--validate SCENARIO ...]` runs this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calibrate.fit import FitReport, fit_table
from calibrate.profile.run import ProfileResult, ProfileSettings, profile_engine
from calibrate.validate import EngineReplay, Fidelity, compare, run_engine
from sim.config.catalogue import get_model
from sim.config.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Bracketed:
    profile: ProfileResult
    fit: FitReport
    fidelities: tuple[Fidelity, ...]  # one per scenario, in the order given


def bracket_problems(settings: ProfileSettings, scenario: Scenario, replays: int = 1
                     ) -> list[str]:
    """Why `scenario` cannot be validated against this profile ('field: ...' messages)."""
    out = []
    if settings.num_passes < replays + 1:
        out.append(f"passes: bracketing {replays} replay(s) needs at least {replays + 1} "
                   f"passes, got {settings.num_passes}")
    profiled = dataclasses.replace(get_model(settings.model), name=scenario.model_spec.name)
    if scenario.model_spec != profiled:
        out.append(f"model: the scenario runs {scenario.model_spec.name}, the profile "
                   f"{settings.model}")
    if scenario.kv.block_size != settings.block_size:
        out.append(f"block_size: the scenario uses kv.block_size {scenario.kv.block_size}, "
                   f"the profile {settings.block_size}")
    return out


def replay_passes(num_passes: int, replays: int) -> list[int]:
    """After which pass each replay runs: consecutive passes centred on the middle."""
    first = max(1, num_passes // 2 - (replays - 1) // 2)
    first = min(first, num_passes - replays)
    return [first + i for i in range(replays)]


def profile_and_validate(settings: ProfileSettings, out_dir: str | Path,
                         scenarios: Sequence[tuple[Scenario, Path | None]],
                         show_progress: bool = True) -> Bracketed:
    """Profile into `out_dir` with each (scenario, base dir) replayed between two passes,
    fit, compare each."""
    problems = [p for scenario, _ in scenarios
                for p in bracket_problems(settings, scenario, len(scenarios))]
    if problems:
        raise ValueError("; ".join(dict.fromkeys(problems)))
    after = dict(zip(replay_passes(settings.num_passes, len(scenarios)), scenarios,
                     strict=True))
    replays: dict[int, EngineReplay] = {}

    def replay(finished_pass: int) -> None:
        if finished_pass in after:
            scenario, base_dir = after[finished_pass]
            replays[finished_pass] = run_engine(scenario, base_dir, settings.device,
                                                settings.threads, settings.clock,
                                                show_progress)

    result = profile_engine(settings, out_dir, show_progress, between_passes=replay)
    if len(replays) < len(after):
        raise RuntimeError("the budget ran out before a replay's pass; raise --budget-s")
    report = fit_table(out_dir)
    fidelities = []
    for k, (scenario, base_dir) in after.items():
        fidelity = compare(scenario, base_dir, out_dir, replays[k])
        where = f"between passes {k} and {k + 1} of the profile's {settings.num_passes}"
        fidelities.append(dataclasses.replace(fidelity,
                                              info={**fidelity.info, "bracketed": where}))
    return Bracketed(result, report, tuple(fidelities))
