"""The CPU fidelity report: the engine against the simulator with its table, on this machine.

    python benchmarks/fidelity_cpu.py                        # profile + validate, ~8 min
    python benchmarks/fidelity_cpu.py --table calibration/cpu-tiny   # validate a table, ~1 min

The first form makes a fresh `tiny` table on this machine (four passes over
the grid, with `scenarios/calibrate_cpu.yaml` and its speculative twin each
replayed on the engine between two passes, the command the calibration
README gives) and writes it, with both fidelity reports, under `--out`
(default results/fidelity-cpu/). The second validates an existing table
(another machine's, say) against this machine's engine, without re-profiling.

Either way it ends with OUT/summary.md: which machine, commit and load
produced the figures, each scenario's metric table and TTFT taken apart.
These are wall-clock figures of a shared machine, so they are reported here,
never asserted by a test. What the tests gate on instead is exact: the
simulator, fed the engine's own measured step times, reproduces every
request's timestamps (each report's world check says so again).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file from anywhere in the checkout
    sys.path.insert(0, str(REPO))

from calibrate.bracket import profile_and_validate  # noqa: E402
from calibrate.fit import format_report  # noqa: E402
from calibrate.profile.rig import git_commit  # noqa: E402
from calibrate.profile.run import ProfileSettings  # noqa: E402
from calibrate.report import (  # noqa: E402
    components_markdown,
    metrics_markdown,
    step_errors,
    steps_markdown,
    write_report,
)
from calibrate.validate import Fidelity, validate  # noqa: E402
from sim.config.loader import load_scenario  # noqa: E402

SCENARIOS = (REPO / "scenarios" / "calibrate_cpu.yaml",
             REPO / "scenarios" / "calibrate_cpu_speculative.yaml")


def machine() -> str:
    """The CPU's model name, its core count and the load now."""
    name = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), name)
    except OSError:
        pass
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"{name}, {os.cpu_count()} cores, load {load} (1/5/15 min)"


def summary(fidelities: list[Fidelity], table: Path, how: str) -> str:
    meta = fidelities[0].metadata
    lines = ["# CPU fidelity", "",
             f"Produced by `python benchmarks/fidelity_cpu.py {how}` at commit "
             f"{git_commit()[:12]} on {machine()}. Table `{table}`: profiled on "
             f"{meta.device_name} at commit {str(meta.engine_commit)[:12]} ({meta.created}). "
             "Wall-clock figures of one run: a CPU table belongs to the machine that "
             "measured it, and a shared machine's speed drifts between runs.", ""]
    for f in fidelities:
        lines += [f"## {f.scenario.name}", "", metrics_markdown(f), "",
                  steps_markdown(step_errors(f.steps)), "", components_markdown(f), "",
                  f"World check (the simulator fed the engine's step times): "
                  f"{f.info.get('world_check')}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "results" / "fidelity-cpu"),
                        help="output directory (default results/fidelity-cpu)")
    parser.add_argument("--table", default=None,
                        help="validate this fitted table instead of profiling a new one")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="the profile's measuring budget in seconds (default 300)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    out = Path(args.out)
    scenarios = [load_scenario(path) for path in SCENARIOS]
    if args.table:
        table = Path(args.table)
        fidelities = [validate(scenario, base, table, show_progress=not args.quiet)
                      for scenario, base in scenarios]
        reports = [out / f"fidelity-{f.scenario.name}" for f in fidelities]
        how = f"--table {args.table}"
    else:
        table = out / "cpu-tiny"
        settings = ProfileSettings(model="tiny", device="cpu", max_num_batched_tokens=512,
                                   max_num_seqs=32, budget_s=args.budget_s, passes=4)
        done = profile_and_validate(settings, table, scenarios, show_progress=not args.quiet)
        print(format_report(done.fit))
        fidelities = list(done.fidelities)
        reports = [table / ("fidelity" if i == 0 else f"fidelity-{f.scenario.name}")
                   for i, f in enumerate(fidelities)]
        how = f"--budget-s {args.budget_s:g}"
    for fidelity, report in zip(fidelities, reports, strict=True):
        write_report(fidelity, report)
    text = summary(fidelities, table, how)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text)
    print(text)
    print(f"wrote {out / 'summary.md'} and the reports in "
          f"{', '.join(str(r) for r in reports)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
