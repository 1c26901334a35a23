"""`servesim explain RUN_DIR` and `servesim plot timeline|slots`: diagnosis on the command line.

Every user mistake (no such run directory, request or policy, a bad count)
is one line on stderr naming the option, the value and what is allowed,
with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded by the commands, not by `servesim --help`
    import pandas as pd

POLICIES = ("static", "dynamic", "continuous")


class UsageError(ValueError):
    """A bad option value: printed as one line, exit code 2."""


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise UsageError(f"{name}: must be >= 1, got {value}")
    return value


def check_png_path(path: Path) -> None:
    """A picture's path must be a file name in a directory that can be written or made."""
    from sim.results.files.output_dir import OutputDirError, check_output_dir

    if path.is_dir():
        raise UsageError(f"--out {str(path)!r}: is a directory; give a PNG file name")
    try:
        check_output_dir(path.parent, f"--out {str(path)!r}: its directory")
    except OutputDirError as err:
        raise UsageError(str(err)) from None


def load_run(run_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """requests.csv of a finished run, checked row by row, and its summary.json (or {})."""
    from sim.observe.run_files import read_requests

    run_dir = Path(run_dir)
    requests = run_dir / "requests.csv"
    if not requests.is_file():
        raise UsageError(f"RUN_DIR {str(run_dir)!r}: no requests.csv there; give the output "
                         "directory of `servesim run` (default results/<scenario name>)")
    summary: dict[str, Any] = {}
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        try:
            loaded = json.loads(summary_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise UsageError(f"{summary_path}: not readable as JSON ({str(err)[:60]}); "
                             "re-run the scenario") from None
        summary = loaded if isinstance(loaded, dict) else {}
    counts = [summary.get(key) for key in ("completed", "rejected")]
    replicated = isinstance(summary.get("ci95"), dict) and "replications" in summary["ci95"]
    expected = None if replicated or not all(type(c) is int for c in counts) else \
        sum(counts)  # type: ignore[arg-type]
    return read_requests(requests, expected), summary


def _explain(args: argparse.Namespace) -> int:
    from sim.observe.explain import DiagnosisError, explain_run

    try:
        frame, summary = load_run(args.run_dir)
        slowest = _positive("--slowest", args.slowest)
        policy = summary.get("scheduler_policy")
        p99 = summary.get("p99_ttft_ms")
        print(explain_run(frame, policy if policy in POLICIES else "continuous",
                          slowest=slowest, request_id=args.request,
                          p99_ttft_ms=float(p99) if isinstance(p99, int | float) else None))
    except (UsageError, DiagnosisError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _plot_timeline(args: argparse.Namespace) -> int:
    from sim.observe.trace import read_timeline
    from sim.plots.timeline import plot_request_timeline

    run_dir = Path(args.run_dir)
    try:
        requests = None
        if args.requests:
            try:
                requests = [int(x) for x in args.requests.split(",") if x.strip()]
            except ValueError:
                raise UsageError(f"--requests: expected request ids like 3,17, got "
                                 f"{args.requests!r}") from None
        frame = read_timeline(run_dir / "timeline.csv")
        out = Path(args.out) if args.out else run_dir / "timeline.png"
        check_png_path(out)
        path = plot_request_timeline(frame, out, requests)
    except (UsageError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"request timeline in {path}")
    return 0


def _plot_slots(args: argparse.Namespace) -> int:
    from sim.config.loader import load_scenario
    from sim.config.yaml_input import ScenarioError
    from sim.experiments.slots import record_slots
    from sim.plots.slots import plot_slot_timelines

    try:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        bad = [p for p in policies if p not in POLICIES]
        if bad or not policies:
            raise UsageError(f"--policies: {args.policies!r} is not a comma-separated list of "
                             f"{', '.join(POLICIES)}")
        for name in ("requests", "steps", "slots"):
            if getattr(args, name) is not None:
                _positive(f"--{name}", getattr(args, name))
        scenario, base_dir = load_scenario(args.scenario, args.overrides)
        if args.mean_output < 0:
            raise UsageError(f"--mean-output: must be >= 0 tokens, got {args.mean_output}")
        out = Path(args.out or Path("results") / scenario.name / "slots.png")
        check_png_path(out)
        recorders = {p: record_slots(scenario, p, args.slots, args.requests, args.steps,
                                     args.arrivals == "burst", args.mean_output, base_dir)
                     for p in policies}
    except (UsageError, ScenarioError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = plot_slot_timelines(recorders, out, args.slots, args.x)
    print(f"batch slots of {', '.join(policies)} in {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `explain` and `plot` (with `timeline` and `slots`) to the servesim parser."""
    p = sub.add_parser("explain", help="why a run's requests waited for their first token",
                       description="Split each request's TTFT into its causes and name the "
                                   "dominant one in plain words.")
    p.add_argument("run_dir", help="output directory of `servesim run`")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--slowest", type=int, default=3, metavar="N",
                       help="explain the N requests with the longest TTFT (default 3)")
    which.add_argument("--request", type=int, metavar="ID", help="explain this request")
    p.set_defaults(func=_explain)

    plot = sub.add_parser("plot", help="timeline pictures: traced requests, batch slots")
    kinds = plot.add_subparsers(dest="plot", required=True)
    t = kinds.add_parser("timeline", help="Gantt chart of the requests a run traced "
                                          "(`servesim run ... --timeline N`)")
    t.add_argument("run_dir", help="output directory of `servesim run --timeline N`")
    t.add_argument("--requests", metavar="ID,ID", help="only these traced requests")
    t.add_argument("--out", help="PNG path (default RUN_DIR/timeline.png)")
    t.set_defaults(func=_plot_timeline)
    s = kinds.add_parser("slots", help="batch slots over time, policy by policy, same requests")
    s.add_argument("scenario", nargs="?", help="scenario YAML; omit for the built-in default")
    s.add_argument("--policies", default="static,continuous",
                   help=f"comma-separated, from {', '.join(POLICIES)} (default static,continuous)")
    s.add_argument("--requests", type=int, default=40, help="first N requests (default 40)")
    s.add_argument("--steps", type=int, default=None,
                   help="steps drawn per policy (default: until every request has finished, "
                        "at most 10,000)")
    s.add_argument("--slots", type=int, default=8,
                   help="batch slots: static/dynamic batch size, continuous max_num_seqs "
                        "(default 8)")
    s.add_argument("--arrivals", choices=("burst", "scenario"), default="burst",
                   help="burst: all at time 0, a backlog (default); scenario: as the file says")
    s.add_argument("--mean-output", type=float, default=20.0, metavar="TOKENS",
                   help="scale output lengths to this mean, spread kept, so a few hundred "
                        "steps show several batches (default 20; 0 = as the scenario draws)")
    s.add_argument("--x", choices=("step", "time"), default="step",
                   help="horizontal axis: engine steps (default) or simulated time")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field (repeatable)")
    s.add_argument("--out", help="PNG path (default results/<scenario name>/slots.png)")
    s.set_defaults(func=_plot_slots)
