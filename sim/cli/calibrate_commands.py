"""`servesim calibrate profile|validate`: argument parsing and the user-facing messages.

Torch and the engine load only when one of these commands runs (this module
imports neither), so `servesim --help` and the simulator stay torch-free.
User errors (bad values, missing files, a mismatched table) print one
message naming the option and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from calibrate.profile.run import ProfileSettings


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def _dirs_ok(dirs: list[tuple[str | None, str]]) -> bool:
    """Check each (directory, option) before any measuring; print the first problem."""
    from sim.results.files.output_dir import OutputDirError, check_output_dir

    try:
        for path, option in dirs:
            if path:
                check_output_dir(Path(path), option)
    except OutputDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return False
    return True


def _option(problem: str) -> str:
    """'field_name: why' -> '--field-name: why'."""
    name, sep, why = problem.partition(":")
    return f"--{name.replace('_', '-')}{sep}{why}"


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
    p.add_argument("--budget-s", type=_seconds, default=None, metavar="S",
                   help="thin the grid to measure within S seconds (corners always kept)")
    p.add_argument("--block-size", type=_positive_int, default=16,
                   help="KV block size in tokens, as the scenarios that will use the table "
                        "set kv.block_size (default 16)")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=512, metavar="N",
                   help="the scheduler's token budget: largest prefill chunk (default 512)")
    p.add_argument("--max-num-seqs", type=_positive_int, default=32, metavar="N",
                   help="largest batch (default 32)")
    p.add_argument("--max-model-len", type=_positive_int, default=None, metavar="N",
                   help="longest sequence profiled (default: the model's context)")
    p.add_argument("--warmup", type=int, default=2, help="discarded steps per shape (default 2)")
    p.add_argument("--repeats", type=_positive_int, default=7,
                   help="timed steps per shape (default 7)")
    p.add_argument("--threads", type=_positive_int, default=1,
                   help="CPU: torch threads (default 1: steady timings on a shared machine)")
    p.add_argument("--passes", type=_positive_int, default=None,
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
    from calibrate.profile.run import ProfileSettings, profile_engine
    from gpu_engine.setup import EngineSetupError
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
        print("error: " + "; ".join(_option(p) for p in problems), file=sys.stderr)
        return 2
    if not _dirs_ok([(args.out, "--out"), (args.fidelity_out, "--fidelity-out")]):
        return 2
    if args.validate:
        return _profile_and_validate(args, settings)
    try:
        result = profile_engine(settings, args.out, show_progress=not args.quiet)
    except EngineSetupError as err:
        print(f"error: --device: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: --out: {args.out}: {err}", file=sys.stderr)
        return 2
    print(f"profiled {len(result.measurements)} of {result.grid_points} step shapes of "
          f"{result.metadata.model_spec.name} on {result.metadata.device_name} in "
          f"{result.measure_s:.1f} s (+{result.setup_s:.1f} s setup)"
          + (f"; {len(result.skipped)} shapes did not form and were skipped"
             if result.skipped else ""))
    print(f"wrote {result.directory}/; next: servesim calibrate fit {result.directory}")
    return 0


def _profile_and_validate(args: argparse.Namespace, settings: ProfileSettings) -> int:
    from calibrate.bracket import bracket_problems, profile_and_validate
    from calibrate.fit import format_report
    from calibrate.report import metrics_markdown, step_errors, steps_markdown, write_report
    from gpu_engine.setup import EngineSetupError
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError

    scenarios = []
    for path in args.validate:
        try:
            scenarios.append(load_scenario(path, args.overrides))
        except ScenarioError as err:
            print(f"error: --validate: {err}", file=sys.stderr)
            return 2
    problems = [p for scenario, _ in scenarios
                for p in bracket_problems(settings, scenario, len(scenarios))]
    if args.fidelity_out and len(scenarios) > 1:
        problems.append(f"fidelity-out: one directory for {len(scenarios)} scenarios; leave "
                        "it out to write OUT/fidelity and OUT/fidelity-<scenario name>")
    if problems:
        print("error: " + "; ".join(_option(p) for p in dict.fromkeys(problems)),
              file=sys.stderr)
        return 2
    try:
        done = profile_and_validate(settings, args.out, scenarios,
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
        out = Path(args.fidelity_out or Path(args.out) / (
            "fidelity" if i == 0 else f"fidelity-{fidelity.scenario.name}"))
        write_report(fidelity, out)
        written.append(str(out))
        print(f"\n{fidelity.scenario.name}:\n{metrics_markdown(fidelity)}\n")
        print(steps_markdown(step_errors(fidelity.steps)))
    print(f"wrote the table to {done.profile.directory}/ and the fidelity report(s) to "
          f"{', '.join(written)}/")
    return 0


def add_validate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "validate", help="replay a scenario on the engine and in the simulator; fidelity report",
        description="Serve the scenario's requests on the real engine (wall clock) and "
                    "simulate the same requests with the table and with the roofline model; "
                    "write a fidelity report (Markdown, JSON, CSV, plots).")
    p.add_argument("scenario", help="scenario YAML (e.g. scenarios/calibrate_cpu.yaml)")
    p.add_argument("--table", required=True, help="fitted calibration table directory")
    p.add_argument("--out", default=None,
                   help="report directory (default: results/<scenario name>_fidelity)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field (repeatable)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="CPU: torch threads (default: the table's, as profiled)")
    p.add_argument("--clock", choices=("wall", "cpu"), default=None,
                   help="the engine's clock (default: the table's, as profiled)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from calibrate.report import metrics_markdown, step_errors, steps_markdown, write_report
    from calibrate.validate import validate_file
    from gpu_engine.setup import EngineSetupError
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError
    from sim.latency.table_format import TableError

    try:  # the report's directory is named after the scenario: check it before the replay
        name = load_scenario(args.scenario, args.overrides)[0].name
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("results") / f"{name}_fidelity")
    if not _dirs_ok([(str(out), "--out" if args.out else "output directory")]):
        return 2
    try:
        fidelity = validate_file(args.scenario, args.table, args.overrides, args.threads,
                                 show_progress=not args.quiet, clock=args.clock)
    except TableError as err:
        print(f"error: --table: {err}", file=sys.stderr)
        return 2
    except (ScenarioError, EngineSetupError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:  # a missing trace, no room for KV
        print(f"error: {args.scenario}: {err}", file=sys.stderr)
        return 2
    write_report(fidelity, out, plots=not args.no_plots)
    print(metrics_markdown(fidelity))
    print()
    print(steps_markdown(step_errors(fidelity.steps)))
    print(f"wrote the fidelity report to {out}/")
    return 0
