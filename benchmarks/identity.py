"""Are two checkouts' results the same? Record a fixed set of runs, then compare two records.

A refactor that moves code must not move a number. This script runs the
commands a user runs (through the `servesim` console script beside this
Python) on small, fixed inputs and keeps every file they write; `compare`
then says, file by file, whether two records are byte-identical once the
fields that hold wall-clock times are left out (`provenance` in summary.json
names the commit, so it differs by design):

    python benchmarks/identity.py record /tmp/before      # at the old commit
    python benchmarks/identity.py record /tmp/after       # at the new one
    python benchmarks/identity.py compare /tmp/before /tmp/after

Recording takes a minute or two on a laptop core. Exit code 0 when every
file matches, 1 otherwise (each difference is named).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# JSON keys (summary.json's, a cached sweep point's), CSV columns and stdout lines that
# carry wall-clock time or the commit
WALL_KEYS = ("provenance", "simulation_wall_s", "wall_s")
WALL_COLUMNS = ("wall_s", "wall_ms", "device_ms")
WALL_LINE_MARKS = ("s wall", "served in")
CACHE = ".servesim-cache"  # sweep points cached under names that hash the commit
# each result directory's list of the files it holds, with their digests (summary.json's
# among them, so it moves with the wall time): the files it lists are compared themselves
MANIFEST = ".servesim-manifest.json"

COMPARE_SPEC = """\
name: identity_compare
scenario:
  name: identity_compare
  seed: 0
  model: llama-3-8b
  hardware: {gpu: h100-sxm, count: 1, memory_utilization: 0.9}
  workload:
    arrivals: {process: poisson, rate: 1.0}
    prompt_tokens: {dist: empirical, trace: builtin:azure_conv, column: prompt, max: 6000}
    output_tokens: {dist: empirical, trace: builtin:azure_conv, column: output, max: 2000}
    num_requests: 150
  slo: {ttft_ms: 2000, tpot_ms: 100}
variants:
  - name: static (B=32)
    set: {scheduler.policy: static, scheduler.batch_size: 32}
  - name: dynamic (B=32, 100 ms)
    set: {scheduler.policy: dynamic, scheduler.batch_size: 32, scheduler.max_wait_ms: 100}
  - name: continuous (paged)
    set: {scheduler.policy: continuous}
rates: [2, 8]
"""

# (name, servesim arguments); OUT is the run's own directory under the record
RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("default", ("run", "--out", "OUT")),
    ("quickstart", ("run", "scenarios/quickstart.yaml", "--out", "OUT", "--timeline", "4")),
    ("fleet", ("run", "scenarios/routing.yaml", "--set", "workload.num_requests=300",
               "--out", "OUT")),
    ("static", ("run", "scenarios/quickstart.yaml", "--set", "scheduler.policy=static",
                "--set", "workload.num_requests=200", "--timeline", "3", "--out", "OUT")),
    ("speculative", ("run", "scenarios/quickstart.yaml", "--set", "speculative.num_tokens=3",
                     "--set", "workload.num_requests=300", "--out", "OUT")),
    ("swap", ("run", "scenarios/quickstart.yaml", "--set", "scheduler.preemption=swap",
              "--set", "kv.num_blocks=2000", "--set", "workload.num_requests=300",
              "--set", "kv.prefix_caching=true", "--out", "OUT")),
    ("compare", ("compare", "SPEC", "--jobs", "1", "--out", "OUT")),
    ("engine_virtual", ("engine", "replay", "scenarios/engine_cpu.yaml", "--virtual-clock",
                        "--device", "cpu", "--set", "workload.num_requests=40", "--out", "OUT")),
    ("engine_speculative", ("engine", "replay", "scenarios/calibrate_cpu_speculative.yaml",
                            "--virtual-clock", "--set", "workload.num_requests=30",
                            "--out", "OUT")),
    ("engine_static", ("engine", "replay", "scenarios/engine_cpu.yaml", "--virtual-clock",
                       "--device", "cpu", "--set", "scheduler.policy=static",
                       "--set", "workload.num_requests=30", "--out", "OUT")),
    ("slots", ("plot", "slots", "--out", "OUT/slots.png")),
)


def record(out: Path) -> int:
    servesim = Path(sys.executable).with_name("servesim")
    out.mkdir(parents=True, exist_ok=False)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "identity_compare.yaml"
        spec.write_text(COMPARE_SPEC)
        for name, args in RUNS:
            run_dir = out / name
            if name == "slots":
                run_dir.mkdir()
            argv = [str(servesim), *(str(run_dir) if a == "OUT" else str(spec) if a == "SPEC"
                                     else a.replace("OUT", str(run_dir)) for a in args)]
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
            (out / f"{name}.stdout").write_text(done.stdout.replace(str(run_dir), "OUT"))
            print(f"{name}: exit {done.returncode}", flush=True)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
        explain = subprocess.run([str(servesim), "explain", str(out / "quickstart"),
                                  "--slowest", "2"], cwd=REPO, capture_output=True, text=True,
                                 check=False)
        (out / "explain.stdout").write_text(explain.stdout)
    return 0


def _json(path: Path) -> str:
    data = json.loads(path.read_text())
    for key in WALL_KEYS:
        data.pop(key, None)
    return json.dumps(data, indent=2, sort_keys=False)


def _csv(path: Path) -> str:
    rows = list(csv.reader(io.StringIO(path.read_text())))
    if not rows:
        return ""
    keep = [i for i, name in enumerate(rows[0]) if name not in WALL_COLUMNS]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in rows:
        writer.writerow([row[i] for i in keep if i < len(row)])
    return buf.getvalue()


def _text(path: Path) -> str:
    lines = path.read_text().splitlines()
    return "\n".join(line for line in lines if not any(m in line for m in WALL_LINE_MARKS))


def comparable(path: Path) -> str | bytes:
    """The file's content with its wall-clock fields left out."""
    if path.suffix == ".json":
        return _json(path)
    if path.suffix == ".csv":
        return _csv(path)
    if path.suffix in (".stdout", ".md"):
        return _text(path)
    return path.read_bytes()


def _cached(root: Path) -> list[str | bytes]:
    """The sweep-point cache's entries, by content: their names hash the commit."""
    return sorted((comparable(p) for p in root.rglob("*")
                   if p.is_file() and CACHE in p.relative_to(root).parts), key=str)


def compare(a: Path, b: Path) -> int:
    files_a, files_b = ({p.relative_to(root) for p in root.rglob("*")
                         if p.is_file() and CACHE not in p.relative_to(root).parts
                         and p.name != MANIFEST}
                        for root in (a, b))
    bad = 0
    if _cached(a) != _cached(b):
        print(f"DIFFERS: the {CACHE} entries")
        bad += 1
    for rel in sorted(files_a ^ files_b):
        print(f"only in {'first' if rel in files_a else 'second'}: {rel}")
        bad += 1
    for root in (a, b):  # provenance is left out of the comparison, but must name a commit
        for path in root.rglob("summary.json"):
            if not json.loads(path.read_text()).get("provenance", {}).get("git_commit"):
                print(f"NO COMMIT in provenance: {path}")
                bad += 1
    same = []
    for rel in sorted(files_a & files_b):
        if comparable(a / rel) == comparable(b / rel):
            same.append(rel)
        else:
            print(f"DIFFERS: {rel}")
            bad += 1
    print(f"{len(same)} files identical (wall times and provenance aside), {bad} not "
          f"({len(_cached(a))} cached points compared by content)")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="run the fixed set of commands into a new directory")
    r.add_argument("out", type=Path)
    c = sub.add_parser("compare", help="compare two records file by file")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        return record(args.out)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
