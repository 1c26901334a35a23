"""`servesim` command line: run scenarios and answer capacity questions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sim import __version__


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="simulate a scenario file (default: the built-in quickstart)")
    p.add_argument("scenario", nargs="?", help="scenario YAML; omit for the built-in default")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. --set workload.arrivals.rate=8 (repeatable)")
    p.add_argument("--out", help="output directory (default: the scenario's output.dir)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from sim.metrics import format_summary
    from sim.run import run_scenario
    from sim.scenario import ScenarioError, load_scenario

    try:
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        result = run_scenario(scenario, base_dir, show_progress=not args.quiet)
    except (ValueError, FileNotFoundError) as err:  # e.g. a missing trace, no room for KV
        print(f"error: {args.scenario or 'default scenario'}: {err}", file=sys.stderr)
        return 2
    out_dir = Path(args.out or scenario.output.dir or Path("results") / scenario.name)
    plots = scenario.output.plots and not args.no_plots
    result.recorder.write_outputs(out_dir, result.summary, plots=plots)
    if not args.quiet:
        model, hw = scenario.model_spec, scenario.hardware_spec
        print(f"scenario {scenario.name}: {model.name} on {hw.name} x{scenario.hardware.count}, "
              f"{scenario.scheduler.policy} batching, {result.num_blocks} KV blocks of "
              f"{scenario.kv.block_size} tokens, latency model: {result.latency_name}")
        print(format_summary(result.summary))
        print(f"simulated in {result.wall_s:.2f} s wall; results in {out_dir}/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sim import capacity

    parser = argparse.ArgumentParser(
        prog="servesim", description="Simulate LLM serving and answer capacity questions.")
    parser.add_argument("--version", action="version", version=f"servesim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    capacity.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
