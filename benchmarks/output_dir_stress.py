"""Many `servesim run`s into one directory at once: each commits a whole result or exits 2.

The issue this guards (issue 46): three concurrent runs into one `--out`, 25 rounds,
once lost a result to a FileNotFoundError in the commit, and two runs could both exit 0
with one result silently replacing the other. Now a run locks its output directory
(sim.results.files.dir_lock) and a second one fails at once, naming the first.

Each round starts RUNS processes of the real console script at the same moment, each
with its own request count (so the result names the run that wrote it), all into one
directory, and then checks:
- every run exits 0 (it committed) or 2 with the one-line "in use by another servesim
  run (pid ...)" message; no traceback, at least one commits;
- the directory is exactly one committed run's files: the names its
  .servesim-manifest.json lists, each with the listed size and sha256; summary.json
  and requests.csv both count that run's requests;
- nothing is left beside it (no hidden staging directory, no lock file).

    python benchmarks/output_dir_stress.py --rounds 25 [--runs 10]

The test suite runs a few rounds (tests/test_output_dir_stress.py).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SERVESIM = Path(sys.executable).with_name("servesim")
BASE_REQUESTS = 20  # run i asks for BASE_REQUESTS + i requests
BUSY = re.compile(r"^error: --out '[^']*': in use by another servesim run \(pid (\d+), ")


@dataclass(frozen=True, slots=True)
class Round:
    """What one round saw: each run's exit code and the requests the directory holds."""

    codes: tuple[int, ...]
    winner_requests: int


def start_runs(out: Path, runs: int, stagger_s: float) -> list[subprocess.Popen[str]]:
    """Start the runs `stagger_s` apart: together they overlap (refusals), spread out some
    find a finished result to replace (commits racing commits)."""
    procs = []
    for i in range(runs):
        procs.append(subprocess.Popen(
            [str(SERVESIM), "run", "--set", f"workload.num_requests={BASE_REQUESTS + i}",
             "--out", str(out), "--quiet", "--no-plots"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(stagger_s)  # a spacing, not a measurement: any value is correct
    return procs


def check_round(out: Path, procs: list[subprocess.Popen[str]], timeout_s: float) -> Round:
    """Wait for the runs and check what they left; raises AssertionError naming a fault."""
    pids, codes = {p.pid for p in procs}, []
    for proc in procs:
        _, err = proc.communicate(timeout=timeout_s)
        codes.append(proc.returncode)
        assert "Traceback" not in err, err
        if proc.returncode == 2:
            busy = BUSY.match(err)
            assert busy and len(err.strip().splitlines()) == 1, err
            assert int(busy.group(1)) in pids - {proc.pid}, err  # names another run here
        else:
            assert proc.returncode == 0, err
    assert 0 in codes, codes
    requests = check_directory(out)
    assert codes[requests - BASE_REQUESTS] == 0, (requests, codes)  # a run that committed
    left = sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".servesim-"))
    assert left == [], left
    return Round(tuple(codes), requests)


def check_directory(out: Path) -> int:
    """Check `out` is one run's complete files; returns that run's request count."""
    manifest = json.loads((out / ".servesim-manifest.json").read_text())
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == {*manifest["files"], ".servesim-manifest.json"}, (on_disk, manifest)
    for name, entry in manifest["files"].items():
        data = (out / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (
            entry["bytes"], entry["sha256"]), name
    summary = json.loads((out / "summary.json").read_text())
    requests = summary["completed"] + summary["rejected"]
    with open(out / "requests.csv", newline="") as rows:
        assert sum(1 for _ in csv.reader(rows)) - 1 == requests  # the same run's rows
    return requests


def stress(parent: Path, rounds: int, runs: int, stagger_s: float = 0.1,
           timeout_s: float = 300.0) -> list[Round]:
    """Rounds into one directory; round r starts its runs (r % 4) * stagger_s apart."""
    out = parent / "race"
    return [check_round(out, start_runs(out, runs, (r % 4) * stagger_s), timeout_s)
            for r in range(rounds)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--runs", type=int, default=10, help="concurrent runs a round")
    p.add_argument("--stagger-s", type=float, default=0.1,
                   help="round r starts its runs (r %% 4) * this apart (default 0.1)")
    args = p.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        seen = stress(Path(tmp), args.rounds, args.runs, args.stagger_s)
    committed = sum(r.codes.count(0) for r in seen)
    print(f"{args.rounds} rounds of {args.runs} concurrent runs into one directory: "
          f"{committed} committed, {args.rounds * args.runs - committed} refused with exit 2, "
          f"0 failed; every round left one run's complete files "
          f"({time.perf_counter() - started:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
