"""`servesim` command line: run, compare and sweep scenarios; answer capacity questions."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from sim import __version__


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="simulate a scenario file (default: the built-in quickstart)")
    p.add_argument("scenario", nargs="?", help="scenario YAML; omit for the built-in default")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. --set workload.arrivals.rate=8 (repeatable)")
    p.add_argument("--out", help="output directory (default: the scenario's output.dir, else "
                                 "results/<name>, plus +KEY=VALUE for each --set); it is replaced "
                                 "whole by the new run")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.add_argument("--timeline", type=int, default=0, metavar="N",
                   help="trace N requests spread over the run: timeline.csv and timeline.png")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.outputs import write_outputs
    from sim.experiments.run import run_scenario
    from sim.results.output_dir import OutputDirError, Staging, variant_dir
    from sim.results.report import format_summary

    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.timeline < 0:
        print(f"error: --timeline: must be >= 0 requests to trace, got {args.timeline}",
              file=sys.stderr)
        return 2
    out_dir, field = out_dir_of(args.out, scenario.output.dir,
                                variant_dir(scenario.name, args.overrides))
    try:
        stage = Staging(out_dir, field)  # checked before the work, swapped in after it
    except OutputDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with stage:
        try:
            result = run_scenario(scenario, base_dir, show_progress=not args.quiet,
                                  timeline=args.timeline)
        except (ValueError, FileNotFoundError) as err:  # e.g. a missing trace, no room for KV
            print(f"error: {args.scenario or 'default scenario'}: {err}", file=sys.stderr)
            return 2
        write_outputs(result, stage.path, plots=scenario.output.plots and not args.no_plots)
        stage.commit()
    if not args.quiet:
        model, hw = scenario.model_spec, scenario.hardware_spec
        fleet = (f" per replica, {scenario.replicas} replicas behind a "
                 f"{scenario.router.policy} router" if scenario.replicas > 1 else "")
        print(f"scenario {scenario.name}: {model.name} on {hw.name} x{scenario.hardware.count}"
              f"{fleet}, {scenario.scheduler.policy} batching, {result.num_blocks} KV blocks of "
              f"{scenario.kv.block_size} tokens, latency model: {result.latency_name}")
        print(format_summary(result.summary))
        print(f"simulated in {result.wall_s:.2f} s wall; results in {out_dir}/")
    return 0


def out_dir_of(flag: str | None, configured: str | None, default: Path,
               config_field: str = "output.dir") -> tuple[Path, str]:
    """The output directory and the setting it came from, for error messages."""
    if flag:
        return Path(flag), "--out"
    if configured:
        return Path(configured), config_field
    return default, "output directory"


def _add_backend_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel runs (default: every CPU; with dask, local workers)")
    p.add_argument("--backend", default="loky", choices=("loky", "dask", "ray"),
                   help="joblib backend: local processes, a Dask cluster or a Ray cluster")
    p.add_argument("--scheduler-address", default=None, metavar="ADDR",
                   help="Dask scheduler to connect to (default: start a LocalCluster)")
    p.add_argument("--out", help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def _add_sweep(sub: argparse._SubParsersAction) -> None:
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
    from sim.experiments.sweep import (
        SHORT_METRICS,
        Backend,
        SweepError,
        markdown_table,
        parse_grid,
        sweep,
        write_table,
    )
    from sim.results.output_dir import OutputDirError, Staging

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
                          progress=not args.quiet)
        except (SweepError, ScenarioError, ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        write_table(table, stage.path, "sweep")
        stage.commit()
    if not args.quiet:
        short = [c for c in table.columns if c in grid or c in SHORT_METRICS]
        print(markdown_table(table[short]), end="")
        print(f"{len(table)} runs; results in {out_dir}/")
    return 0


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="variants of a scenario on the same requests, over load")
    p.add_argument("spec", help="compare spec YAML (base scenario, variants, rates)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _add_backend_options(p)
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.compare import format_compare, load_spec, run_compare, write_compare
    from sim.experiments.sweep import Backend, SweepError
    from sim.results.output_dir import OutputDirError, Staging

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
            result = run_compare(base, backend, progress=not args.quiet)
        except (SweepError, ScenarioError, ValueError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        write_compare(result, stage.path, plots=not args.no_plots)
        stage.commit()
    if not args.quiet:
        print(format_compare(result))
        print(f"results in {out_dir}/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sim import capacity, engine_cli

    parser = argparse.ArgumentParser(
        prog="servesim", description="Simulate LLM serving and answer capacity questions.")
    parser.add_argument("--version", action="version", version=f"servesim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_compare(sub)
    _add_sweep(sub)
    capacity.register(sub)
    from sim import schema_cli, tokens_cli

    schema_cli.register(sub)
    tokens_cli.register(sub)
    from sim import explain_cli

    explain_cli.register(sub)
    engine_cli.register(sub)
    from calibrate import cli as calibrate_cli  # imported here: sim never needs calibrate

    calibrate_cli.register(sub)
    return parser


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, file: object = None, line: str | None = None) -> None:
    """A warning is for the user: one `warning: ...` line, not the source line that raised it."""
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; Ctrl-C and a closed pipe end it quietly, for every command.

    Ctrl-C: exit code 130 and one line; loky's worker processes are stopped so no
    semaphore is leaked, and a result directory in the making is removed
    (sim.results.output_dir). A reader that stops early (`servesim explain ... | head`):
    the rest of the output is dropped and the exit code is 141, as for SIGPIPE.
    """
    try:
        args = build_parser().parse_args(argv)
        with warnings.catch_warnings():  # restores the usual display when the command returns
            warnings.showwarning = _one_line_warning
            code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except KeyboardInterrupt:
        _stop_workers()
        lead = "\n" if sys.stderr.isatty() else ""  # end a progress bar's line first
        print(f"{lead}interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _drop_stdout()
        return 141


def _stop_workers() -> None:
    """Shut joblib's reusable loky pool down, if one was started, so it frees its semaphores."""
    loky = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(loky, "_executor", None)
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured in tests): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
