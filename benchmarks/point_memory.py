"""Peak RSS of a sweep point and of replications: this checkout against a base checkout.

A sweep, compare, plan or replication point used to keep every request's row in
memory (~200 B a request with its TTFT diagnosis) although only its summary
travels back; now it keeps none, so its memory follows the requests in flight.
Each command runs as a whole process (`--jobs 1`: the point runs in that
process), its peak RSS read from the kernel as it exits (wait4), the checkouts
in turn. The workload is bench_point.py's (bench_sim's): Azure conversation lengths, Poisson
arrivals, Llama-3-8B on one H100.

    python benchmarks/point_memory.py --base BASE                 # 200k requests at 2 req/s
    python benchmarks/point_memory.py --base BASE --requests 50000 --only sweep

`--base DIR`: a checkout with its own `.venv`. Prints one JSON line per command and
checkout, then the ratios (base / new: above 1 is less memory now).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from bench_point import scenario_dict  # this folder is the script's sys.path[0]

HERE = Path(__file__).resolve().parent.parent
COMMANDS = ("sweep", "replications")


def argv(command: str, path: Path, out: Path, num_requests: int) -> list[str]:
    if command == "sweep":
        return ["sweep", str(path), "--grid", f"workload.num_requests={num_requests}",
                "--jobs", "1", "--quiet", "--out", str(out)]
    return ["run", str(path), "--replications", "2", "--jobs", "1", "--quiet", "--no-plots",
            "--out", str(out)]


def peak_rss_mib(checkout: Path, args: list[str]) -> tuple[float, float]:
    """The process's peak RSS (MiB) and CPU time (s), from the kernel as it exits."""
    proc = subprocess.Popen([str(checkout / ".venv" / "bin" / "python"), "-m", "sim.cli",
                             *args], cwd=checkout, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{checkout}: servesim {' '.join(args)} exited {proc.returncode}")
    return usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, help="base checkout (with .venv)")
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--rate", type=float, default=2.0)
    p.add_argument("--only", choices=COMMANDS, action="append")
    a = p.parse_args()
    checkouts = {"new": HERE, **({"base": a.base.resolve()} if a.base else {})}
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "point_memory.yaml"
        path.write_text(yaml.safe_dump(scenario_dict(a.requests, a.rate)))
        for command in a.only or COMMANDS:
            for name, checkout in checkouts.items():
                out = Path(tmp) / f"{command}_{name}"
                rss, cpu_s = peak_rss_mib(checkout, argv(command, path, out, a.requests))
                figures.setdefault(command, {})[name] = rss
                print(json.dumps({"command": command, "checkout": name, "requests": a.requests,
                                  "rate": a.rate, "peak_rss_mib": round(rss, 1),
                                  "cpu_s": round(cpu_s, 1)}), flush=True)
    for command, rss in figures.items():
        if "base" in rss:
            print(f"{command}: {a.requests} requests, peak RSS {rss['base']:.0f} -> "
                  f"{rss['new']:.0f} MiB ({rss['base'] / rss['new']:.2f}x less)")


if __name__ == "__main__":
    sys.exit(main())
