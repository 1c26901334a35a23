"""`servesim compare SPEC` and `servesim sweep SCENARIO --grid ...`: many runs in parallel.

Both share the backend options (loky processes here, or a Dask or Ray
cluster); a bad grid, spec or output directory exits 2 before any run starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.cli.run import out_dir_of


def _add_backend_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel runs (default: every CPU; with dask, local workers)")
    p.add_argument("--backend", default="loky", choices=("loky", "dask", "ray"),
                   help="joblib backend: local processes, a Dask cluster or a Ray cluster")
    p.add_argument("--scheduler-address", default=None, metavar="ADDR",
                   help="Dask scheduler to connect to (default: start a LocalCluster)")
    p.add_argument("--out", help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a grid of scenario overrides in parallel")
    p.add_argument("scenario", help="scenario YAML")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a field and its values (YAML), e.g. --grid scheduler.max_num_seqs=64,256"
                        " (repeatable: the cartesian product runs)")
    p.add_argument("--plots", action="store_true",
                   help="also write each point's outputs and plots under OUT/runs/")
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
    from sim.results.files.output_dir import OutputDirError, Staging

    default = Path("results") / f"sweep_{Path(args.scenario).stem}"
    out_dir, field = out_dir_of(args.out, None, default)
    try:
        grid = parse_grid(args.grid)
        backend = Backend(args.backend, args.jobs, args.scheduler_address)
        stage = Staging(out_dir, field)
    except (SweepError, OutputDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with stage:
        try:
            table = sweep(args.scenario, grid, backend, stage.path, plots=args.plots,
                          progress=not args.quiet, cache=PointCache.beside(out_dir))
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
    return 0


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="variants of a scenario on the same requests, over load")
    p.add_argument("spec", help="compare spec YAML (base scenario, variants, rates)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _add_backend_options(p)
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.cache import CACHE_DIR, PointCache
    from sim.experiments.compare import format_compare, load_spec, run_compare, write_compare
    from sim.experiments.sweep import Backend, SweepError
    from sim.results.files.output_dir import OutputDirError, Staging

    try:
        base = load_spec(args.spec)
        backend = Backend(args.backend, args.jobs, args.scheduler_address)
        name = base.spec.name or Path(args.spec).stem
        out_dir, field = out_dir_of(args.out, base.spec.out, Path("results") / f"compare_{name}",
                                    config_field=f"{args.spec}: out")
        stage = Staging(out_dir, field)
    except (SweepError, ScenarioError, OutputDirError) as err:
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
        print(f"{len(result.probes)} runs ({result.reused} reused from {CACHE_DIR}/); "
              f"results in {out_dir}/")
    return 0
