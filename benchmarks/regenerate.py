"""Regenerate every published figure from the current code, stamped with what produced it.

    python benchmarks/regenerate.py                   # every step
    python benchmarks/regenerate.py --list            # the steps, their cost, what each writes
    python benchmarks/regenerate.py --only quickstart,tokens
    python benchmarks/regenerate.py --skip bench_sim_1m,notebooks

A step runs the same command a reader would (`servesim ...`, a benchmark
script, a notebook), copies its pictures into docs/ and writes its numbers to
docs/figures.md, which the README cites: after each step the README's quoted
runs and its `<!-- figures: NAME -->` blocks are rewritten from that file
(benchmarks/readme_figures.py), and tests/test_readme_claims.py holds them to it;
the doc pages' quoted runs are rewritten by their steps the same way
(figure_steps.PAGE_QUOTES, held to docs/figures.md by tests/test_regenerate.py).
Each step owns one section of that file, headed by the machine, commit and date
that produced it, so a step run alone replaces its own section and leaves the
others as they were. Scratch
results go to --work (default results/regenerate/, which git ignores). A
failing step is reported and the rest still run; the exit status is then 1.

The steps themselves are benchmarks/figure_steps.py's registry; this is the runner.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the steps beside it, however loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import readme_figures  # noqa: E402
from figure_steps import STEPS  # noqa: E402
from figure_tools import REPO, Context, Step  # noqa: E402

FIGURES = Path("docs/figures.md")
HEADER = """# Published figures

Written by `python benchmarks/regenerate.py` (do not edit by hand). Each section
names the machine and commit that produced it; the README and the notebooks
quote these runs. Simulated numbers depend on the code only; wall times and
everything measured on the engine belong to the machine that measured them.
"""


# -- provenance and the figures file -----------------------------------------------

def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def provenance() -> str:
    """Machine and commit in one line; taken before any step writes a tracked file."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        where = "no git checkout"
    else:
        outputs = [f":(exclude){path}" for step in STEPS for path in step.publishes]
        # the figures themselves may differ from the commit: only the code must not
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                     f":(exclude){FIGURES}", *outputs)
        where = f"commit {commit}" + (" with uncommitted changes" if dirty else "")
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"{_cpu_model()}, {os.cpu_count()} CPUs{load}, {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}, numpy "
            f"{_version('numpy')}, torch {_version('torch')}; {where}")


_SECTION = re.compile(r"<!-- step: (\S+) -->\n(.*?)<!-- end: \1 -->\n", re.DOTALL)


def read_sections(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _SECTION.finditer(text)}


def write_figures(sections: dict[str, str]) -> str:
    """docs/figures.md: the header, then each known step's section in step order."""
    parts = [HEADER]
    for step in STEPS:
        if step.name in sections:
            parts.append(f"\n<!-- step: {step.name} -->\n{sections[step.name]}"
                         f"<!-- end: {step.name} -->\n")
    return "".join(parts)


def section(step: Step, stamp: str, wall_s: float, body: str) -> str:
    today = datetime.date.today().isoformat()
    return (f"## {step.name}: {step.what}\n\nProduced on {stamp}, {today}, in {wall_s:.1f} s."
            f"\n\n{body.rstrip()}\n")


# -- the command line --------------------------------------------------------------

def choose(only: str | None, skip: str | None) -> list[Step]:
    """The steps to run, in their fixed order; ValueError names an unknown one."""
    names = [s.name for s in STEPS]
    for flag, value in (("--only", only), ("--skip", skip)):
        unknown = [n for n in (value or "").split(",") if n and n not in names]
        if unknown:
            raise ValueError(f"{flag} {','.join(unknown)}: unknown step; steps: "
                             f"{', '.join(names)}")
    wanted = set(only.split(",")) if only else set(names)
    wanted -= set((skip or "").split(","))
    return [s for s in STEPS if s.name in wanted]


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="STEP,STEP", help="run just these steps")
    parser.add_argument("--skip", metavar="STEP,STEP", help="run every step but these")
    parser.add_argument("--list", action="store_true", help="print the steps and exit")
    parser.add_argument("--work", default="results/regenerate",
                        help="scratch directory for the runs (default results/regenerate)")
    parser.add_argument("--figures", default=str(FIGURES),
                        help=f"the figures file to update (default {FIGURES})")
    parser.add_argument("--readme", default="README.md",
                        help="the README whose quoted runs to refresh (default README.md)")
    args = parser.parse_args(argv)
    try:
        steps = choose(args.only, args.skip)
    except ValueError as err:
        print(f"regenerate: error: {err}", file=sys.stderr)
        return 2
    if args.list:
        for s in STEPS:
            print(f"{s.name:<15} {s.cost:>7}  {s.what}; writes "
                  f"{', '.join((*s.publishes, args.figures))}")
        return 0
    ctx = Context(work=(REPO / args.work).resolve(), stamp=provenance(),
                  readme=(REPO / args.readme).resolve())
    ctx.work.mkdir(parents=True, exist_ok=True)
    figures = REPO / args.figures
    sections = read_sections(figures.read_text()) if figures.is_file() else {}
    failed, started = [], time.perf_counter()
    print(f"regenerating {len(steps)} step(s) on {ctx.stamp}", flush=True)
    for i, step in enumerate(steps, start=1):
        print(f"[{i}/{len(steps)}] {step.name}: {step.what} (about {step.cost}) ...",
              flush=True)
        t0 = time.perf_counter()
        try:
            body = step.run(ctx)
        except Exception as err:  # one broken step must not cost the others their figures
            print(f"[{i}/{len(steps)}] {step.name}: FAILED: {type(err).__name__}: {err}",
                  flush=True)
            failed.append(step.name)
            continue
        wall_s = time.perf_counter() - t0
        sections[step.name] = section(step, ctx.stamp, wall_s, body)
        write_atomically(figures, write_figures(sections))  # after every step: none lost
        readme_figures.refresh(ctx.readme, sections)  # the README's quoted figures with it
        wrote = ", ".join((*step.publishes, args.figures))
        print(f"[{i}/{len(steps)}] {step.name}: done in {wall_s:.1f} s; wrote {wrote}",
              flush=True)
    total_s = time.perf_counter() - started
    print(f"{len(steps) - len(failed)} of {len(steps)} step(s) in {total_s:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
