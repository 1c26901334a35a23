"""Regenerate every published figure from the current code, stamped with what produced it.

    python benchmarks/regenerate.py                   # every step
    python benchmarks/regenerate.py --list            # the steps, their cost, what each writes
    python benchmarks/regenerate.py --only quickstart,tokens
    python benchmarks/regenerate.py --skip bench_sim_1m,notebooks

A step runs the same command a reader would (`servesim ...`, a benchmark
script, a notebook), copies its pictures into docs/ and writes its numbers to
docs/figures.md, which the README cites. Each step owns one section of that
file, headed by the machine, commit and date that produced it, so a step run
alone replaces its own section and leaves the others as they were. Scratch
results go to --work (default results/regenerate/, which git ignores). A
failing step is reported and the rest still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURES = Path("docs/figures.md")
HEADER = """# Published figures

Written by `python benchmarks/regenerate.py` (do not edit by hand). Each section
names the machine and commit that produced it; the README and the notebooks
quote these runs. Simulated numbers depend on the code only; wall times and
everything measured on the engine belong to the machine that measured them.
"""


class StepFailed(Exception):
    """A command of a step exited with an unexpected status."""


@dataclass(frozen=True, slots=True)
class Context:
    work: Path  # scratch results, absolute
    stamp: str  # machine and commit, computed once before anything is written
    readme: Path  # the README whose quoted runs are refreshed (a copy, in the tests)


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    what: str
    cost: str  # measured wall time on a 2-core machine (all steps: ~15 min)
    publishes: tuple[str, ...]  # paths, relative to the repository, besides docs/figures.md
    run: Callable[[Context], str]  # returns the Markdown body of the step's section


def command(args: Sequence[str], ok: Sequence[int] = (0,)) -> str:
    """Run `args` in the repository root; stdout is returned, stderr (progress bars) shown."""
    done = subprocess.run(list(args), cwd=REPO, stdout=subprocess.PIPE, text=True)
    if done.returncode not in ok:
        raise StepFailed(f"`{' '.join(args)}` exited with status {done.returncode}")
    return done.stdout


def servesim(*args: str, ok: Sequence[int] = (0,)) -> str:
    return command([sys.executable, "-m", "sim.cli", *args], ok)


def shown(args: Sequence[str], output: str) -> str:
    """A fenced block: the command as a reader types it, then what it printed."""
    return f"```\n$ servesim {' '.join(args)}\n{output.rstrip()}\n```\n"


def publish(source: Path, target: str) -> None:
    (REPO / target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, REPO / target)


def run_and_show(*args: str, ok: Sequence[int] = (0,)) -> str:
    return shown(args, servesim(*args, ok=ok))


def refresh_readme(readme: Path, command_line: str, output: str) -> None:
    """Replace what the README shows under `$ command_line` with `output` (the same fenced
    block, the same command line): the README quotes runs, and tests hold it to them."""
    text = readme.read_text()
    head = f"$ {command_line}\n"
    start = text.index(head) + len(head)
    end = text.index("```", start)
    readme.write_text(text[:start] + output.rstrip("\n") + "\n" + text[end:])


# -- the steps ----------------------------------------------------------------------

README_CAPACITY = ("capacity", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--context", "8192",
                   "--batch", "32")


def capacity(ctx: Context) -> str:
    sheet = servesim(*README_CAPACITY)
    refresh_readme(ctx.readme, "servesim " + " ".join(README_CAPACITY), sheet)
    return "\n".join([
        shown(README_CAPACITY, sheet),
        run_and_show("capacity", "--model", "llama-3.1-8b", "--context", "128k", "--batch", "1"),
        run_and_show("capacity", "--model", "llama-3-70b", ok=(1,)),  # exit 1: does not fit
    ])


def tokens(ctx: Context) -> str:
    return run_and_show("tokens", "docs/tokens_sample.txt", "--tokenizer", "byte",
                        "--tokenizer", "mistral-v1", "--tokenizer", "mistral-tekken")


def quickstart(ctx: Context) -> str:
    out = ctx.work / "quickstart"
    text = run_and_show("run", "scenarios/quickstart.yaml", "--timeline", "6", "--out", str(out))
    printed = text.split("\n", 2)[2].rsplit("```", 1)[0]  # the output, without the fence
    refresh_readme(ctx.readme, "servesim run scenarios/quickstart.yaml",
                   printed.replace(str(out), "results/quickstart"))
    publish(out / "latency_cdf.png", "docs/quickstart_latency_cdf.png")
    publish(out / "timeseries.png", "docs/quickstart_timeseries.png")
    publish(out / "timeline.png", "docs/timeline.png")
    return text.replace(str(out), "results/quickstart")


def slots(ctx: Context) -> str:
    return run_and_show("plot", "slots", "--out", "docs/slots.png")


def compare(spec: str, pictures: dict[str, str]) -> Callable[[Context], str]:
    """A `servesim compare` step: its compare.md, and the named plots copied to docs/."""
    def step(ctx: Context) -> str:
        out = ctx.work / f"compare_{Path(spec).stem}"
        servesim("compare", spec, "--out", str(out))
        for source, target in pictures.items():
            publish(out / source, target)
        tables = re.sub(r"^# ", "### ", (out / "compare.md").read_text(), flags=re.MULTILINE)
        return f"`servesim compare {spec}`:\n\n{tables}"
    return step


ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")


def routing(ctx: Context) -> str:
    rows = ["| router | prefix hit rate | mean TTFT | p50 TTFT | p99 TTFT | SLO attainment "
            "| req/s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for policy in ROUTERS:
        out = ctx.work / f"routing_{policy}"
        servesim("run", "scenarios/routing.yaml", "--set", f"router.policy={policy}",
                 "--out", str(out), "--quiet")
        s = json.loads((out / "summary.json").read_text())
        rows.append(f"| {policy} | {s['prefix_hit_rate']:.1%} | {s['mean_ttft_ms'] / 1e3:.2f} s "
                    f"| {s['median_ttft_ms'] / 1e3:.2f} s | {s['p99_ttft_ms'] / 1e3:.2f} s "
                    f"| {s['slo_attainment']:.1%} | {s['request_throughput']:.2f} |")
    publish(ctx.work / "routing_round_robin" / "load_balance.png",
            "docs/routing_load_balance.png")
    return ("`servesim run scenarios/routing.yaml --set router.policy=ROUTER`; the picture "
            "is round_robin's `load_balance.png`.\n\n" + "\n".join(rows) + "\n")


LONG_CONTEXT_GRID = ("workload.prompt_tokens.value=3840,7936,16128,32512,65280,130816",
                     "workload.arrivals.rate=0.02,100")


def long_context(ctx: Context) -> str:
    out = ctx.work / "sweep_long_context"
    args = ["sweep", "scenarios/long_context.yaml", "--plots"]
    for grid in LONG_CONTEXT_GRID:
        args += ["--grid", grid]
    servesim(*args, "--quiet", "--out", str(out))
    publish(out / "sweep.png", "docs/long_context_sweep.png")
    return f"`servesim {' '.join(args)}`:\n\n" + (out / "sweep.md").read_text()


def engine_replay(ctx: Context) -> str:
    out = ctx.work / "engine_cpu"
    text = run_and_show("engine", "replay", "scenarios/engine_cpu.yaml", "--no-plots",
                        "--out", str(out))
    return text.replace(str(out), "results/engine_cpu_engine")


FIDELITY = {"calibrate_cpu": "calibration/cpu-tiny/fidelity",
            "calibrate_cpu_speculative": "calibration/cpu-tiny/fidelity-calibrate_cpu_speculative"}
FIDELITY_FILES = ("fidelity.json", "fidelity.md", "steps.csv", "requests.csv",
                  "latency_cdf.png", "step_latency.png")


def fidelity(ctx: Context) -> str:
    """The shipped CPU table validated against this machine's engine (no re-profiling)."""
    out = ctx.work / "fidelity_cpu"
    command([sys.executable, "benchmarks/fidelity_cpu.py", "--table", "calibration/cpu-tiny",
             "--out", str(out), "--quiet"])
    for name, target in FIDELITY.items():
        for file in FIDELITY_FILES:
            publish(out / f"fidelity-{name}" / file, f"{target}/{file}")
        report = REPO / target / "fidelity.json"  # its table, relative to where it now lies
        body = json.loads(report.read_text())
        body["table"] = os.path.relpath(REPO / "calibration" / "cpu-tiny", REPO / target)
        report.write_text(json.dumps(body, indent=2) + "\n")
    summary = (out / "summary.md").read_text().split("\n", 1)[1].replace(str(out), "results")
    return ("`python benchmarks/fidelity_cpu.py --table calibration/cpu-tiny`; the reports "
            "in calibration/cpu-tiny/fidelity*/.\n" + re.sub(r"^#", "###", summary,
                                                            flags=re.MULTILINE))


def bench_sim(*args: str, json_name: str) -> Callable[[Context], str]:
    def step(ctx: Context) -> str:
        cmd = ["benchmarks/bench_sim.py", *args, "--json", f"benchmarks/results/{json_name}"]
        out = command([sys.executable, *cmd])
        return f"```\n$ python {' '.join(cmd)}\n{out.rstrip()}\n```\n"
    return step


def bench_engine(ctx: Context) -> str:
    cmd = ["benchmarks/bench_engine.py", "--device", "cpu", "--repeats", "10", "--out",
           "benchmarks/results"]
    return f"```\n$ python {' '.join(cmd)}\n```\n\n" + command([sys.executable, *cmd])


def serve(ctx: Context) -> str:
    """servesim serve measured by servesim load and by vLLM's bench serve (where VLLM_PYTHON
    names a venv with vLLM; else that part keeps its last published section)."""
    command([sys.executable, "benchmarks/serve_fidelity.py"])
    out = REPO / "benchmarks" / "results" / "serve"
    publish(out / "simulated" / "load" / "fidelity" / "latency_cdf.png",
            "docs/serve_latency_cdf.png")
    body = (out / "README.md").read_text().split("\n", 1)[1]
    return re.sub(r"^## ", "### ", body, flags=re.MULTILINE)


NOTEBOOKS = tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "notebooks").glob("*.ipynb")))
PROVENANCE_TAG = "provenance"


def notebooks(ctx: Context) -> str:
    """Execute each notebook in place (nbclient), ending it with a cell saying what ran it."""
    import nbformat
    from nbclient import NotebookClient

    rows = ["| notebook | wall s |", "| --- | --- |"]
    for name in NOTEBOOKS:
        path = REPO / name
        nb = nbformat.read(path, as_version=4)
        nb.cells = [c for c in nb.cells if PROVENANCE_TAG not in c.metadata.get("tags", [])]
        for cell in nb.cells:  # no per-cell timestamps: a rerun differs only where outputs do
            cell.metadata.pop("execution", None)
        started = time.perf_counter()
        NotebookClient(nb, timeout=900, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        wall_s = time.perf_counter() - started
        note = nbformat.v4.new_markdown_cell(
            f"*Outputs above produced by `python benchmarks/regenerate.py --only notebooks` "
            f"on {ctx.stamp}.*")
        note.id = PROVENANCE_TAG  # a fixed id: a rerun changes the text only
        note.metadata["tags"] = [PROVENANCE_TAG]
        nb.cells.append(note)
        nbformat.write(nb, path)
        rows.append(f"| [{Path(name).stem}](../{name}) | {wall_s:.1f} |")
    return "Executed in place with nbclient:\n\n" + "\n".join(rows) + "\n"


BATCHING_PNG = {"throughput.png": "docs/batching_throughput.png",
                "latency_vs_throughput.png": "docs/batching_latency.png",
                "pareto.png": "docs/batching_pareto.png", "waste.png": "docs/batching_waste.png"}
PAGED_PNG = {"throughput.png": "docs/paged_throughput.png", "waste.png": "docs/paged_waste.png"}

STEPS = (
    Step("capacity", "the capacity sheets the README prints", "2 s", ("README.md",), capacity),
    Step("tokens", "token counts of docs/tokens_sample.txt", "1 s", (), tokens),
    Step("quickstart", "the worked example, its plots and a 6-request timeline", "2 s",
         ("README.md", "docs/quickstart_latency_cdf.png", "docs/quickstart_timeseries.png",
          "docs/timeline.png"), quickstart),
    Step("slots", "batch slots under static vs continuous batching", "1 s",
         ("docs/slots.png",), slots),
    Step("batching", "static vs dynamic vs continuous batching over load", "20 s",
         tuple(BATCHING_PNG.values()), compare("scenarios/batching_policies.yaml",
                                               BATCHING_PNG)),
    Step("paged", "paged vs contiguous KV", "10 s", tuple(PAGED_PNG.values()),
         compare("scenarios/paged_vs_contiguous.yaml", PAGED_PNG)),
    Step("prefix_caching", "Mooncake trace, prefix caching off vs on", "45 s", (),
         compare("scenarios/prefix_caching.yaml", {})),
    Step("routing", "4 replicas behind three routers", "30 s",
         ("docs/routing_load_balance.png",), routing),
    Step("speculative", "speculative decoding off vs draft model vs n-gram", "50 s", (),
         compare("scenarios/speculative.yaml", {})),
    Step("long_context", "4k to 128k context, trickle and burst", "25 s",
         ("docs/long_context_sweep.png",), long_context),
    Step("engine_replay", "the CPU engine serving scenarios/engine_cpu.yaml", "35 s", (),
         engine_replay),
    Step("fidelity", "the CPU table against this machine's engine", "1.5 min",
         tuple(f"{t}/{f}" for t in FIDELITY.values() for f in FIDELITY_FILES), fidelity),
    Step("bench_sim", "simulator speed and memory: start-up, 10k requests at 2 and 200 req/s",
         "1 min", ("benchmarks/results/bench_sim.json",),
         bench_sim("--only", "help", "quickstart", "2rps", "saturating", "--rounds", "1",
                   json_name="bench_sim.json")),
    Step("bench_sim_1m", "simulator speed and memory at a million requests (2 req/s, 10x "
         "overload)", "20 min", ("benchmarks/results/bench_sim_1m.json",),
         bench_sim("--only", "1m", "overload", "--rounds", "1", json_name="bench_sim_1m.json")),
    Step("bench_engine", "engine kernels on this CPU against their floors", "2.5 min",
         ("benchmarks/results/bench_engine.json",), bench_engine),
    Step("serve", "servesim load and vllm bench serve against servesim serve", "3 min",
         ("benchmarks/results/serve/README.md", "docs/serve_latency_cdf.png"), serve),
    Step("notebooks", "every notebook executed in place", "1 min", NOTEBOOKS, notebooks),
)


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
        wrote = ", ".join((*step.publishes, args.figures))
        print(f"[{i}/{len(steps)}] {step.name}: done in {wall_s:.1f} s; wrote {wrote}",
              flush=True)
    total_s = time.perf_counter() - started
    print(f"{len(steps) - len(failed)} of {len(steps)} step(s) in {total_s:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
