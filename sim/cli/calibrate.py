"""`servesim calibrate ...`: turn engine measurements into the simulator's latency table.

`profile` (run the engine over a grid of step shapes) and `validate` (engine
vs simulator on one trace) need the engine: their parsers live in
sim.cli.calibrate_commands, which loads torch only when one of them runs. The
calibrate package itself is imported only inside the commands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `calibrate` command group to servesim's subcommands."""
    p = sub.add_parser("calibrate", help="fit latency tables from engine measurements",
                       description="Calibration tables: profile the engine, fit, validate.")
    commands = p.add_subparsers(dest="calibrate_command", required=True, metavar="COMMAND")
    register_profile(commands)
    _register_fit(commands)
    register_validate(commands)


def register_profile(commands: argparse._SubParsersAction) -> None:
    """`calibrate profile --model SPEC --device cpu|cuda --out DIR` (calibrate/profile.py)."""
    from sim.cli.calibrate_commands import add_profile

    add_profile(commands)


def register_validate(commands: argparse._SubParsersAction) -> None:
    """`calibrate validate SCENARIO --table DIR` (calibrate/validate.py, report.py)."""
    from sim.cli.calibrate_commands import add_validate

    add_validate(commands)


def _register_fit(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "fit", help="fit DIR's measurements; write DIR/fit.json and print held-out error",
        description="Fit measurements.csv to the table latency model (non-negative least "
                    "squares) and report mean and p90 absolute percentage error on held-out "
                    "measurements, then refit on all of them.")
    p.add_argument("dir", help="calibration table directory (metadata.json, measurements.csv)")
    p.add_argument("--timing", choices=("wall", "device"), default=None,
                   help="column to predict: whole-step wall time or device time "
                        "(default: metadata.json's timing)")
    p.add_argument("--holdout-every", type=int, default=5, metavar="N",
                   help="hold out every Nth measurement after a seeded shuffle (default 5)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.set_defaults(func=_fit)


def _fit(args: argparse.Namespace) -> int:
    from calibrate.fit import fit_table, format_report
    from sim.latency.table_format import FIT_FILE, TableError
    from sim.results.output_dir import OutputDirError, check_output_dir

    try:
        check_output_dir(Path(args.dir), "DIR")  # fit.json goes there: refuse before fitting
    except OutputDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        report = fit_table(args.dir, args.timing, args.holdout_every, args.seed)
    except TableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    print(f"wrote {args.dir.rstrip('/')}/{FIT_FILE}")
    return 0
