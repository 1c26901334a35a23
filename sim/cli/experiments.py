"""`servesim compare SPEC` and `servesim sweep SCENARIO --grid ...`: many runs in parallel.

Both share the backend options (loky processes here, or a Dask or Ray
cluster); a bad grid, spec or output directory exits 2 before any run starts, and a run
where every request was rejected exits 2 once the results are written (as `run`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sim.cli.run import add_force_option, out_dir_of


def _add_set_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a field of {what}, as `servesim run --set` does, e.g. --set "
                        "scheduler.max_num_seqs=64 (repeatable; the default output directory "
                        "gains +KEY=VALUE)")


def _add_backend_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel runs (default: every CPU; with dask, local workers)")
    p.add_argument("--backend", default="loky", choices=("loky", "dask", "ray"),
                   help="joblib backend: local processes, a Dask cluster or a Ray cluster")
    p.add_argument("--scheduler-address", default=None, metavar="ADDR",
                   help="Dask scheduler to connect to (default: start a LocalCluster)")
    p.add_argument("--out", help="output directory")
    add_force_option(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a grid of scenario overrides in parallel")
    p.add_argument("scenario", help="scenario YAML")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a field and its values (YAML), e.g. --grid scheduler.max_num_seqs=64,256"
                        " (repeatable: the cartesian product runs)")
    p.add_argument("--plots", action="store_true",
                   help="also write each point's outputs and plots under OUT/runs/")
    _add_set_option(p, "the scenario at every grid point")
    _add_backend_options(p)
    p.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.cache import CACHE_DIR, PointCache
    from sim.experiments.sweep import (
        SHORT_METRICS,
        Backend,
        SweepError,
        markdown_table,
        parse_grid,
        sweep,
        write_table,
    )
    from sim.results.files.output_dir import OutputDirError, Staging, variant_dir

    default = variant_dir(f"sweep_{Path(args.scenario).stem}", args.overrides)
    out_dir, field = out_dir_of(args.out, None, default)
    try:
        grid = parse_grid(args.grid)
        backend = Backend(args.backend, args.jobs, args.scheduler_address)
        stage = Staging(out_dir, field, "sweep", args.force)
    except (SweepError, OutputDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with stage:
        try:
            table = sweep(args.scenario, grid, backend, stage.path, plots=args.plots,
                          progress=not args.quiet, cache=PointCache.beside(out_dir),
                          sets=args.overrides)
        except (SweepError, ScenarioError, ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        write_table(table, stage.path, "sweep")
        stage.commit()
    if not args.quiet:
        short = [c for c in table.columns if c in grid or c in SHORT_METRICS]
        print(markdown_table(table[short]), end="")
        reused = table.attrs.get("reused", 0)
        print(f"{len(table)} runs ({reused} reused from {CACHE_DIR}/); results in {out_dir}/")
    return _served_nothing(table.attrs["nothing_served"], out_dir)


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="variants of a scenario on the same requests, over load")
    p.add_argument("spec", help="compare spec YAML (base scenario, variants, rates)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--confidence", type=float, default=None, metavar="C",
                   help="the SLO search's rates must meet the SLOs at this probability (e.g. "
                   "0.95) under simulation noise and the model's error against real servers: "
                   "bounds tightened by the model error, attainment's lower bound at the "
                   "threshold (docs/uncertainty.md); overrides the spec's `confidence:`")
    _add_set_option(p, "the base scenario (not one a variant or the rates set)")
    _add_backend_options(p)
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.cache import CACHE_DIR, PointCache
    from sim.experiments.compare import format_compare, load_spec, run_compare, write_compare
    from sim.experiments.sweep import Backend, SweepError
    from sim.results.files.output_dir import OutputDirError, Staging, variant_dir

    try:
        base = load_spec(args.spec, args.overrides, args.confidence)
        backend = Backend(args.backend, args.jobs, args.scheduler_address)
        name = base.spec.name or Path(args.spec).stem
        named = [*args.overrides, *([f"confidence={args.confidence:g}"]
                                    if args.confidence is not None else [])]
        out_dir, field = out_dir_of(args.out, base.spec.out,
                                    variant_dir(f"compare_{name}", named),
                                    config_field=f"{args.spec}: out")
        stage = Staging(out_dir, field, "compare", args.force)
    except (SweepError, ScenarioError, OutputDirError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with stage:
        try:
            result = run_compare(base, backend, progress=not args.quiet,
                                 cache=PointCache.beside(out_dir))
        except (SweepError, ScenarioError, ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        write_compare(result, stage.path, plots=not args.no_plots)
        stage.commit()
    if not args.quiet:
        print(format_compare(result))
        if base.confidence_note:
            print(base.confidence_note)
        print(f"{len(result.probes)} runs ({result.reused} reused from {CACHE_DIR}/); "
              f"results in {out_dir}/")
    return _served_nothing(result.nothing_served, out_dir)


def _served_nothing(runs: Sequence[str], out_dir: Path) -> int:
    """Exit 2, naming each run where every request was rejected (as `run` does), once the
    results are written; else 0."""
    for run in runs:
        print(f"error: {run}", file=sys.stderr)
    if runs:
        print(f"error: {len(runs)} run(s) served nothing (their files, the reasons per "
              f"request among them, are in {out_dir}/)", file=sys.stderr)
        return 2
    return 0
