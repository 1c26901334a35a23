"""`servesim run [SCENARIO]`: simulate one scenario, print vLLM's result block, write its files.

The scenario is read and the output directory checked before anything runs;
the run then goes through sim.experiments.run and sim.experiments.outputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.cli import start_up


def add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="simulate a scenario file (default: the built-in quickstart)")
    p.add_argument("scenario", nargs="?", help="scenario YAML; omit for the built-in default")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. --set workload.arrivals.rate=8 (repeatable)")
    p.add_argument("--out", help="output directory (default: the scenario's output.dir, else "
                                 "results/<name>, plus +KEY=VALUE for each --set); the new run "
                                 "replaces the files an earlier run wrote there")
    add_force_option(p)
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.add_argument("--replications", type=int, default=1, metavar="N",
                   help="independent replications (seeds derived from the scenario's): the "
                        "ci95 block comes from their spread instead of batch means in one run")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel replications (default: every CPU)")
    p.add_argument("--backend", default="loky", choices=("loky", "dask", "ray"),
                   help="joblib backend for the replications")
    p.add_argument("--timeline", type=int, default=0, metavar="N",
                   help="trace N requests spread over the run: timeline.csv and timeline.png")
    p.set_defaults(func=_run, own_start_up=True)


def _run(args: argparse.Namespace) -> int:
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.outputs import write_outputs
    from sim.experiments.run import run_scenario
    from sim.results.files.output_dir import OutputDirError, Staging, variant_dir
    from sim.results.files.report import format_summary, jsonable, nothing_served

    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for note in scenario.model_notes:
        print(f"note: model: {note}", file=sys.stderr)
    if args.replications != 1:  # joblib's backends and the sweep machinery only for these
        from sim.experiments.replicate import MAX_REPLICATIONS, replicate
        from sim.experiments.sweep import Backend

        if not 1 <= args.replications <= MAX_REPLICATIONS:
            print(f"error: --replications: must be 1..{MAX_REPLICATIONS}, got "
                  f"{args.replications}", file=sys.stderr)
            return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs: must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    if args.timeline < 0:
        print(f"error: --timeline: must be >= 0 requests to trace, got {args.timeline}",
              file=sys.stderr)
        return 2
    out_dir, field = out_dir_of(args.out, scenario.output.dir,
                                variant_dir(scenario.name, args.overrides))
    try:
        stage = Staging(out_dir, field, "run", args.force)  # checked and locked before the
        # work, swapped in after it
    except OutputDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    start_up.started()  # read and checked: the work begins
    with stage:
        try:
            if args.replications > 1:
                result, _ = replicate(scenario, base_dir, args.replications,
                                      Backend(args.backend, args.jobs), not args.quiet,
                                      requests_csv=stage.path / "requests.csv")
            else:
                result = run_scenario(scenario, base_dir, show_progress=not args.quiet,
                                      timeline=args.timeline,
                                      requests_csv=stage.path / "requests.csv")
        except (ValueError, FileNotFoundError) as err:  # e.g. a missing trace, no room for KV
            print(f"error: {args.scenario or 'default scenario'}: {err}", file=sys.stderr)
            return 2
        write_outputs(result, stage.path, plots=scenario.output.plots and not args.no_plots)
        stage.commit()
    served = nothing_served(result.summary)
    if served is not None:  # no latency to report: a "Benchmark duration" would mislead
        print(f"error: {args.scenario or 'default scenario'}: {served}; its files (the "
              f"reasons per request in requests.csv) are in {out_dir}/", file=sys.stderr)
        return 2
    if not args.quiet:
        model, hw = scenario.model_spec, scenario.hardware_spec
        fleet = (f" per replica, {scenario.replicas} replicas behind a "
                 f"{scenario.router.policy} router" if scenario.replicas > 1 else "")
        print(f"scenario {scenario.name}: {model.name} on {hw.name} x{scenario.hardware.count}"
              f"{fleet}, {scenario.scheduler.policy} batching, {result.num_blocks} KV blocks of "
              f"{scenario.kv.block_size} tokens, latency model: {result.latency_name}")
        print(format_summary(jsonable(result.summary)))
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


def add_force_option(p: argparse.ArgumentParser) -> None:
    """`--force`, the same words for every command that writes an output directory."""
    p.add_argument("--force", action="store_true",
                   help="write into an output directory that holds files servesim did not "
                        "write (they are kept) or another command's result (it is replaced); "
                        "without --force such a directory is refused. Each run lists the "
                        "files it wrote in DIR/.servesim-manifest.json, and a later run "
                        "replaces only those")
