"""`servesim calibrate profile`: measure the engine's step cycle into a table directory.

The table (and, with `--validate`, its fit and fidelity reports) is written into a staged
directory and committed whole (sim.results.files.output_dir), so a crash or Ctrl-C
mid-profile leaves the old table as it was; an outside `--fidelity-out` is a second staged
directory, locked before anything is measured. Torch loads only when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.cli.calibrate_commands import option_name, positive_int, seconds
from sim.cli.run import add_force_option

if TYPE_CHECKING:
    from calibrate.profile.run import ProfileSettings
    from sim.results.files.output_dir import Staging


def add_profile(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "profile", help="measure the engine's step cycle over a grid of step shapes",
        description="Run the real engine over prefill-only, decode-only and mixed step "
                    "shapes and write DIR/measurements.csv + DIR/metadata.json "
                    "(then `servesim calibrate fit DIR`).")
    p.add_argument("--model", required=True, help="catalogue model, e.g. tiny or llama-3-8b")
    p.add_argument("--device", required=True, choices=("cpu", "cuda"),
                   help="where the engine runs; the table belongs to this device")
    p.add_argument("--out", required=True, help="table directory to write")
    add_force_option(p)
    p.add_argument("--budget-s", type=seconds, default=None, metavar="S",
                   help="thin the grid to measure within S seconds (corners always kept)")
    p.add_argument("--block-size", type=positive_int, default=16,
                   help="KV block size in tokens, as the scenarios that will use the table "
                        "set kv.block_size (default 16)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=512, metavar="N",
                   help="the scheduler's token budget: largest prefill chunk (default 512)")
    p.add_argument("--max-num-seqs", type=positive_int, default=32, metavar="N",
                   help="largest batch (default 32)")
    p.add_argument("--max-model-len", type=positive_int, default=None, metavar="N",
                   help="longest sequence profiled (default: the model's context)")
    p.add_argument("--warmup", type=int, default=2, help="discarded steps per shape (default 2)")
    p.add_argument("--repeats", type=positive_int, default=7,
                   help="timed steps per shape (default 7)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="CPU: torch threads (default 1: steady timings on a shared machine)")
    p.add_argument("--passes", type=positive_int, default=None,
                   help="times the grid is measured, in new random orders (default: 3 on CPU, "
                        "1 on CUDA)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: time the CPU engine by its thread's CPU time, immune to other "
                        "jobs taking the core (validate then replays on the same clock)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights' and KV's dtype (default auto: bfloat16 on cuda, float32 on "
                        "cpu)")
    p.add_argument("--seed", type=int, default=0, help="random weights' seed")
    p.add_argument("--validate", metavar="SCENARIO", action="append", default=[],
                   help="also fit, and validate on SCENARIO replayed between the middle two "
                        "passes (a shared machine's speed drifts; the table then averages "
                        "it around the replay); repeatable, each between its own two passes")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="with --validate: override a field of every scenario (repeatable)")
    p.add_argument("--fidelity-out", default=None, metavar="DIR",
                   help="with --validate: report directory (default OUT/fidelity, then "
                        "OUT/fidelity-<scenario name> for each further scenario)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_profile)


def _profile(args: argparse.Namespace) -> int:
    from calibrate.profile.run import ProfileSettings
    from sim.config.catalogue import get_model

    try:
        get_model(args.model)
    except ValueError as err:
        print(f"error: --model: {err}", file=sys.stderr)
        return 2
    settings = ProfileSettings(
        model=args.model, device=args.device, block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len, budget_s=args.budget_s, warmup=args.warmup,
        repeats=args.repeats, threads=args.threads, dtype=args.dtype, seed=args.seed,
        passes=args.passes, clock=args.clock)
    problems = settings.problems()
    if problems:
        print("error: " + "; ".join(option_name(p) for p in problems), file=sys.stderr)
        return 2
    scenarios = _scenarios(args, settings) if args.validate else []
    if scenarios is None:
        return 2
    from sim.results.files.output_dir import OutputDirError, Staging

    try:  # checked and locked before measuring, swapped in whole after it
        table = Staging(Path(args.out), "--out", "calibrate profile", args.force)
    except OutputDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with table:
        if not scenarios:
            return _profile_into(args, settings, table)
        report = None
        if args.fidelity_out and _inside(args.fidelity_out, args.out) is None:
            try:  # a report directory of its own, staged and locked as validate's
                report = Staging(Path(args.fidelity_out), "--fidelity-out",
                                 "calibrate validate", args.force)
            except OutputDirError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
        with report or contextlib.nullcontext():
            return _profile_and_validate(args, settings, scenarios, table, report)


def _inside(path: str, out: str) -> str | None:
    """`path` relative to `out` when it lies inside it ("." for `out` itself), else None."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(out))
    return None if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def _profile_into(args: argparse.Namespace, settings: ProfileSettings, table: Staging) -> int:
    from calibrate.profile.run import profile_engine
    from gpu_engine.setup import EngineSetupError

    try:
        result = profile_engine(settings, table.path, show_progress=not args.quiet)
    except EngineSetupError as err:
        print(f"error: --device: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: --out: {args.out}: {err}", file=sys.stderr)
        return 2
    table.commit()
    print(f"profiled {len(result.measurements)} of {result.grid_points} step shapes of "
          f"{result.metadata.model_spec.name} on {result.metadata.device_name} in "
          f"{result.measure_s:.1f} s (+{result.setup_s:.1f} s setup)"
          + (f"; {len(result.skipped)} shapes did not form and were skipped"
             if result.skipped else ""))
    print(f"wrote {args.out}/; next: servesim calibrate fit {args.out}")
    return 0


def _scenarios(args: argparse.Namespace, settings: ProfileSettings) -> list[Any] | None:
    """The --validate scenarios, or None after printing why they cannot be bracketed."""
    from calibrate.bracket import bracket_problems
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError

    scenarios = []
    for path in args.validate:
        try:
            scenarios.append(load_scenario(path, args.overrides))
        except ScenarioError as err:
            print(f"error: --validate: {err}", file=sys.stderr)
            return None
    problems = [p for scenario, _ in scenarios
                for p in bracket_problems(settings, scenario, len(scenarios))]
    if args.fidelity_out and len(scenarios) > 1:
        problems.append(f"fidelity-out: one directory for {len(scenarios)} scenarios; leave "
                        "it out to write OUT/fidelity and OUT/fidelity-<scenario name>")
    if problems:
        print("error: " + "; ".join(option_name(p) for p in dict.fromkeys(problems)),
              file=sys.stderr)
        return None
    return scenarios


def _profile_and_validate(args: argparse.Namespace, settings: ProfileSettings,
                          scenarios: list[Any], table: Staging, report: Staging | None) -> int:
    """Profile into `table`, replay between passes, fit; each report goes into `report`
    (--fidelity-out outside OUT) or inside the table, staged with it."""
    from calibrate.bracket import profile_and_validate
    from calibrate.fit import format_report
    from calibrate.report import metrics_markdown, step_errors, steps_markdown, write_report
    from gpu_engine.setup import EngineSetupError

    try:
        done = profile_and_validate(settings, table.path, scenarios,
                                    show_progress=not args.quiet)
    except EngineSetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:  # a missing trace, no room for KV
        print(f"error: --validate: {', '.join(args.validate)}: {err}", file=sys.stderr)
        return 2
    print(format_report(done.fit))
    written = []
    for i, fidelity in enumerate(done.fidelities):
        rel = _inside(args.fidelity_out, args.out) if args.fidelity_out else (
            "fidelity" if i == 0 else f"fidelity-{fidelity.scenario.name}")
        staged, lands_at = ((report.path, report.target) if report is not None else
                            (table.path / rel, table.target / rel))
        fidelity = dataclasses.replace(fidelity, table_dir=table.target)  # where it will lie
        write_report(fidelity, staged, lands_at=lands_at)
        written.append(str(args.fidelity_out or Path(args.out) / rel))
        print(f"\n{fidelity.scenario.name}:\n{metrics_markdown(fidelity)}\n")
        print(steps_markdown(step_errors(fidelity.steps)))
    table.commit()
    if report is not None:
        report.commit()
    print(f"wrote the table to {args.out}/ and the fidelity report(s) to "
          f"{', '.join(written)}/")
    return 0
