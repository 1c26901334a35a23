"""Simulator speed and memory: this checkout against a base checkout, whole processes in turn.

Azure-2023-conversation lengths (builtin:azure_conv, sampled with
replacement), Poisson arrivals, continuous batching, Llama-3-8B on one H100
with the roofline model. Every point runs in a fresh process (its peak RSS is
its own); the two checkouts alternate, round after round, so a busy machine
slows both alike, and each figure is the median over the rounds. Ratios are
new / base (RSS: base / new, so above 1 is better everywhere).

    python benchmarks/bench_sim.py --base BASE             # every point but 10m, 3 rounds
    python benchmarks/bench_sim.py --base BASE --only 2rps --rounds 5
    python benchmarks/bench_sim.py --only 1m --rounds 1       # this checkout alone
    python benchmarks/bench_sim.py --point 10000 2            # one point here, as JSON

`--base DIR`: a checkout with its own `.venv` (e.g. `git worktree add --detach
BASE main`). Points without a base run (1m, overload, 10m: the base needs
minutes to hours there) report this checkout's figures only. For this
checkout a point also counts the events fast-forward leaves: each run of
decode steps is one event, every other step one; the ceiling is steps /
events, the speed-up if an event's cost did not depend on what it covers.

Every point runs as an installed servesim does: with its modules' bytecode
cached. pip compiles site-packages at install and a first run writes the cache
of an editable checkout, unless PYTHONDONTWRITEBYTECODE is set (as on the
machines these figures come from: every process would then compile the
project's ~120 modules again, ~0.1 s). Each checkout gets a cache of its own
under a temporary PYTHONPYCACHEPREFIX, filled by one untimed run of each
start-up command and of a 200-request point, so neither checkout is written
to. A simulation point's process also starts as the `servesim` process does
where the checkout has that start-up (sim.cli.start_up: no garbage collections
and no pydantic plugin scan while it imports, one BLAS thread; bench_point.py),
as `servesim run` would run it; the base, the code before it, starts plainly,
as its own `servesim` did. `help` and `quickstart` time start-up; their rows
also give the process's CPU time (user + system), steadier than wall time on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_point import one_point  # this folder is the script's sys.path[0]

HERE = Path(__file__).resolve().parent.parent
# name: (requests, rate req/s, compared with the base); 243 req/s is 10x the 24.3 req/s one
# H100 completes on these lengths when saturated
POINTS = {"2rps": (10_000, 2.0, True), "saturating": (10_000, 200.0, True),
          "1m": (1_000_000, 2.0, False), "overload": (1_000_000, 243.0, False),
          "10m": (10_000_000, 2.0, False),
          # shorter long points for a shared machine: RSS against requests done, and the
          # bytes a waiting request costs at 10x overload
          "200k": (200_000, 2.0, False), "overload_200k": (200_000, 243.0, False)}
DEFAULT = ("help", "quickstart", "2rps", "saturating", "1m", "overload")


def _python(checkout: Path) -> str:
    return str(checkout / ".venv" / "bin" / "python")


def _start_up_process(checkout: Path, point: str, env: dict[str, str] | None) -> None:
    """`servesim --help`, or the quickstart without plots into a directory removed after."""
    with tempfile.TemporaryDirectory(prefix="bench-quickstart-") as out:
        args = ["--help"] if point == "help" else [
            "run", str(checkout / "scenarios" / "quickstart.yaml"), "--no-plots", "--out",
            str(Path(out) / "run")]
        subprocess.run([_python(checkout), "-m", "sim.cli", *args], check=True,
                       capture_output=True, cwd=checkout, env=env)


def bytecode_cache(checkouts: list[Path], points: list[str], cache: Path
                   ) -> dict[Path, dict[str, str]]:
    """Per checkout, the environment of a process with its own bytecode cache under `cache`,
    filled by one untimed run of each start-up point and, for the simulation points, of a
    200-request one (see the module's docstring)."""
    envs = {}
    for i, checkout in enumerate(checkouts):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(cache / str(i))
        for point in points:
            if point in POINTS:
                _simulation_process(checkout, 200, 2.0, env)
            else:
                _start_up_process(checkout, point, env)
        envs[checkout] = env
    return envs


def _simulation_process(checkout: Path, n: int, rate: float, env: dict[str, str] | None
                        ) -> dict:
    """`n` requests at `rate` in one process of `checkout`'s bench_sim.py: its row."""
    out = subprocess.run([_python(checkout), str(checkout / "benchmarks" / "bench_sim.py"),
                          "--point", str(n), str(rate)], check=True, capture_output=True,
                         text=True, cwd=checkout, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(checkout: Path, point: str, env: dict[str, str] | None = None) -> dict:
    """One whole process of `checkout` for `point`; wall_s is the process's, end to end
    (for help and quickstart, cpu_s its user + system time too)."""
    started = time.perf_counter()
    if point in ("help", "quickstart"):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        _start_up_process(checkout, point, env)
        wall_s = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return {"process_wall_s": wall_s, "process_cpu_s": cpu_s}
    n, rate, _ = POINTS[point]
    row = _simulation_process(checkout, n, rate, env)
    row["process_wall_s"] = time.perf_counter() - started
    return row


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(point: str, new: list[dict], base: list[dict]) -> dict:
    wall = _median(new, "process_wall_s")
    line = {"point": point, "rounds": len(new), "new_process_wall_s": wall}
    if point in ("help", "quickstart"):
        line["new_process_cpu_s"] = _median(new, "process_cpu_s")
    else:
        n = new[0]["n"]
        line.update(steps=new[0]["steps"], new_req_per_wall_s=n / wall,
                    new_steps_per_wall_s=new[0]["steps"] / wall,
                    new_peak_rss_mib=_median(new, "peak_rss_mib"),
                    max_waiting=new[0]["max_waiting"])
        if "events" in new[0]:
            line.update(events=new[0]["events"], decode_runs=new[0]["decode_runs"],
                        ceiling=new[0]["steps"] / new[0]["events"])
        if "rss_bytes_per_request_done" in new[0]:
            line["rss_bytes_per_request_done"] = new[0]["rss_bytes_per_request_done"]
        if new[0]["max_waiting"] >= 1000:  # a queue long enough to weigh
            grown = _median(new, "peak_rss_mib") - _median(new, "rss_after_setup_mib")
            line["bytes_per_waiting"] = grown * 2**20 / new[0]["max_waiting"]
    if base:
        base_wall = _median(base, "process_wall_s")
        line.update(base_process_wall_s=base_wall, speedup=base_wall / wall)
        if point in ("help", "quickstart"):
            line["base_process_cpu_s"] = _median(base, "process_cpu_s")
        else:
            line["rss_ratio"] = _median(base, "peak_rss_mib") / line["new_peak_rss_mib"]
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="the checkout to compare against")
    parser.add_argument("--only", nargs="+", choices=(*POINTS, "help", "quickstart"),
                        default=list(DEFAULT))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--point", nargs=2, type=float, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(one_point(int(args.point[0]), args.point[1])))
        return
    with tempfile.TemporaryDirectory(prefix="bench-pycache-") as cache:
        new_rows, base_rows = _rounds(args, Path(cache))
    lines = [report(p, new_rows[p], base_rows[p]) for p in args.only]
    machine = {"machine": platform.node(), "cpus": _cpus(), "python": platform.python_version(),
               "commit": _commit(HERE), "base_commit": _commit(args.base) if args.base else None}
    print(json.dumps(machine))
    for line in lines:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in line.items()}))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "points": lines}, indent=2))


def _rounds(args: argparse.Namespace, cache: Path
            ) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Every point's rows, this checkout's and the base's, the sides alternating by round."""
    start_up = [p for p in args.only if p in ("help", "quickstart")]
    warm = start_up + [p for p in args.only if p in POINTS][:1]  # one simulation point warms all
    envs = bytecode_cache([HERE] + ([args.base] if args.base else []), warm, cache)
    new_rows: dict[str, list[dict]] = {p: [] for p in args.only}
    base_rows: dict[str, list[dict]] = {p: [] for p in args.only}
    for round_ in range(args.rounds):
        for point in args.only:
            compared = args.base is not None and (point in ("help", "quickstart")
                                                  or POINTS[point][2])
            if point in POINTS and not POINTS[point][2] and round_:
                continue  # the long points run once
            sides = [("new", HERE, new_rows)] + ([("base", args.base, base_rows)]
                                                 if compared else [])
            if round_ % 2:
                sides.reverse()
            for name, checkout, rows in sides:
                rows[point].append(measure(checkout, point, envs[checkout]))
                print(f"round {round_ + 1} {point} {name}: "
                      f"{rows[point][-1]['process_wall_s']:.2f} s", file=sys.stderr, flush=True)
    return new_rows, base_rows


def _cpus() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line)
    except (OSError, StopIteration):
        model = platform.processor()
    return f"{os.cpu_count()} x {model}"


def _commit(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip()


if __name__ == "__main__":
    main()
