"""`servesim calibrate ...`: turn engine measurements into the simulator's latency table.

`profile` (run the engine over a grid of step shapes) and `validate` (engine
vs simulator on one trace) need the engine: their parsers live in
sim.cli.calibrate_profile and sim.cli.calibrate_commands, which load torch only when
one of them runs. The calibrate package itself is imported only inside the commands.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from sim.cli.run import add_force_option


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `calibrate` command group to servesim's subcommands."""
    p = sub.add_parser("calibrate", help="fit latency tables from engine measurements",
                       description="Calibration tables: profile the engine, fit, validate.")
    commands = p.add_subparsers(dest="calibrate_command", required=True, metavar="COMMAND")
    register_profile(commands)
    _register_fit(commands)
    register_validate(commands)
    _register_import(commands)


def register_profile(commands: argparse._SubParsersAction) -> None:
    """`calibrate profile --model SPEC --device cpu|cuda --out DIR` (calibrate/profile/run.py)."""
    from sim.cli.calibrate_profile import add_profile

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
    from sim.results.files.output_dir import OutputDirError, Staging

    try:  # locked while fitting; fit.json is staged, then added to DIR whole
        with Staging(Path(args.dir), "DIR", "calibrate fit", adds=True) as stage:
            report = fit_table(args.dir, args.timing, args.holdout_every, args.seed,
                               out=stage.path)
            stage.commit()
    except (OutputDirError, TableError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    print(f"wrote {args.dir.rstrip('/')}/{FIT_FILE}")
    return 0


def _register_import(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "import", help="turn a published GPU profile (Vidur, LLMServingSim) into a table",
        description="Compose step times from a published per-kernel GPU profile, write them "
                    "as a device-time table at OUT and fit it; parts the profile lacks "
                    "(attention, lm_head, all-reduce, CPU overhead) come from the roofline "
                    "and are named in metadata.json and here.")
    p.add_argument("source", choices=("vidur", "llmservingsim"), help="who published DIR")
    p.add_argument("dir", help="one profiled model: Vidur's compute/<gpu>/<org>/<model>/ "
                               "(mlp.csv[, attention.csv]) or LLMServingSim's "
                               "<GPU>/<org>/<model>/tp<N>/ (layers.csv)")
    p.add_argument("--model", required=True, help="catalogue model the profile measured")
    p.add_argument("--gpu", required=True, help="catalogue GPU it ran on, e.g. a100-80gb")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (default 1)")
    p.add_argument("--out", required=True, help="table directory to write")
    add_force_option(p)
    p.add_argument("--attention", default=None, metavar="FILE",
                   help="vidur: an attention.csv elsewhere than DIR")
    p.add_argument("--cpu-overheads", default=None, metavar="FILE",
                   help="vidur: a cpu_overheads.csv with this model's host times")
    p.add_argument("--commit", default=None, help="the source repository's commit, recorded")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (default 16)")
    p.add_argument("--max-num-batched-tokens", type=int, default=4096, metavar="N",
                   help="largest step the table's grid composes (default 4096)")
    p.add_argument("--max-num-seqs", type=int, default=128, metavar="N",
                   help="largest decode batch composed (default 128)")
    p.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    from calibrate.fit import format_report
    from calibrate.published.import_profile import describe, import_profile
    from sim.config.catalogue import get_hardware, get_model
    from sim.latency.table_format import TableError
    from sim.results.files.output_dir import OutputDirError, Staging

    for option, value in (("--tp", args.tp), ("--block-size", args.block_size),
                          ("--max-num-batched-tokens", args.max_num_batched_tokens),
                          ("--max-num-seqs", args.max_num_seqs)):
        if value < 1:
            print(f"error: {option}: must be >= 1, got {value}", file=sys.stderr)
            return 2
    try:
        spec, hardware = get_model(args.model), get_hardware(args.gpu)
        with Staging(Path(args.out), "--out", "calibrate import", args.force) as stage:
            result = import_profile(
                args.source, args.dir, spec, hardware, stage.path, args.tp, args.block_size,
                args.max_num_batched_tokens, args.max_num_seqs,
                Path(args.attention) if args.attention else None,
                Path(args.cpu_overheads) if args.cpu_overheads else None, args.commit)
            stage.commit()
        result = dataclasses.replace(result, directory=Path(args.out))
    except (OutputDirError, TableError, ValueError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    for line in describe(result):
        print(line)
    print(format_report(result.report))
    return 0
