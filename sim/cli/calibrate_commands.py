"""`servesim calibrate validate`, and the option parsing `calibrate profile` shares with it.

Torch and the engine load only when one of these commands runs (this module
imports neither), so `servesim --help` and the simulator stay torch-free.
User errors (bad values, missing files, a mismatched table) print one
message naming the option and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.cli.run import add_force_option


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, refused with the value echoed."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def option_name(problem: str) -> str:
    """'field_name: why' -> '--field-name: why'."""
    name, sep, why = problem.partition(":")
    return f"--{name.replace('_', '-')}{sep}{why}"


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
    add_force_option(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field (repeatable)")
    p.add_argument("--threads", type=positive_int, default=None,
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
    from sim.results.files.output_dir import OutputDirError, Staging

    try:  # the report's directory is named after the scenario: check it before the replay
        name = load_scenario(args.scenario, args.overrides)[0].name
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("results") / f"{name}_fidelity")
    try:  # checked and locked before the replay, swapped in after it
        stage = Staging(out, "--out" if args.out else "output directory",
                        "calibrate validate", args.force)
    except OutputDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with stage:
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
        write_report(fidelity, stage.path, plots=not args.no_plots, lands_at=stage.target)
        stage.commit()
    print(metrics_markdown(fidelity))
    print()
    print(steps_markdown(step_errors(fidelity.steps)))
    print(f"wrote the fidelity report to {out}/")
    return 0
