"""servesim against every real vLLM serving run: signed errors per run and metric, their medians.

    python benchmarks/real_runs.py [DIR]              # DIR default: calibration/real_runs/
    python benchmarks/real_runs.py --plot out.png     # also predicted vs measured, log-log
    python benchmarks/real_runs.py --set latency.step_overhead_ms=0 --set latency.seq_overhead_ms=0

Each measured stage (calibrate.real_runs: a model on H100 at its TP, vLLM's
limits, a constant-rate cycle of grouped prompts) is simulated for the
stage's duration with servesim's defaults, and compared with what the real
server's client measured: TTFT (mean, p50, p99), TPOT, end-to-end latency
(mean, p50) and output throughput, each as a signed error, plus servesim's
own verdict (sustained or not) and how TTFT grows over the run. `--set`
adds scenario overrides to every run (an ablation). `--seeds 3` also prints
the noise floor: each run's spread over seeds.

It writes `benchmarks/results/real_runs/` (or `--out`): errors.csv and
errors.md, the signed errors and medians only. The measured figures are
third-party data that the repository never holds, so nothing written here
contains them, and the plot is drawn on demand, never committed.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file from anywhere in the checkout
    sys.path.insert(0, str(REPO))

from calibrate.real_runs import (  # noqa: E402
    DEFAULT_DIR,
    METRIC_NAMES,
    RealRun,
    median_abs,
    read_runs,
    signed_errors,
    simulate_row,
)

OUT = REPO / "benchmarks" / "results" / "real_runs"


def _overrides(sets: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`--set section.key=value` for the latency and scheduler sections, parsed as YAML."""
    import yaml

    sections: dict[str, dict[str, Any]] = {"latency": {}, "scheduler": {}}
    for item in sets:
        key, sep, value = item.partition("=")
        section, dot, field = key.partition(".")
        if not sep or not dot or section not in sections:
            raise SystemExit(f"--set {item!r}: give latency.<field>=<value> or "
                             f"scheduler.<field>=<value>")
        sections[section][field] = yaml.safe_load(value)
    return sections["latency"], sections["scheduler"]


def _one(args: tuple[RealRun, int, float | None, dict, dict]) -> dict[str, Any]:
    run, seed, duration_s, latency, scheduler = args
    p = simulate_row(run, seed, duration_s, latency, scheduler)
    return {"figures": dict(p.figures), "sustained": p.sustained, "growth": p.ttft_growth}


def evaluate(runs: list[RealRun], seeds: int = 1, duration_s: float | None = None,
             latency: dict | None = None, scheduler: dict | None = None,
             progress: bool = True) -> list[list[dict[str, Any]]]:
    """Per run, one result per seed, simulated in parallel over the CPUs."""
    from tqdm import tqdm

    jobs = [(run, seed, duration_s, latency or {}, scheduler or {})
            for run in runs for seed in range(seeds)]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        results = list(tqdm(pool.map(_one, jobs), total=len(jobs), desc="real runs",
                            unit="run", disable=not progress, file=sys.stderr))
    return [results[i * seeds:(i + 1) * seeds] for i in range(len(runs))]


def error_rows(runs: list[RealRun], results: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per run: its signed errors (seed 0), verdicts and, with seeds, their spread."""
    rows = []
    for run, per_seed in zip(runs, results, strict=True):
        errors = signed_errors(per_seed[0]["figures"], run.measured)
        row: dict[str, Any] = {"run": run.name, "stage": run.stage, "steady": run.steady,
                               "sustained": per_seed[0]["sustained"],
                               "ttft_growth": per_seed[0]["growth"], **errors}
        if len(per_seed) > 1:
            for metric in ("ttft_p50", "tpot", "e2e_mean"):
                values = [signed_errors(r["figures"], run.measured)[metric] for r in per_seed]
                row[f"{metric}_seed_spread"] = max(values) - min(values)
        rows.append(row)
    return rows


def medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median absolute error per metric over the steady stages."""
    steady = [r for r in rows if r["steady"]]
    return {m: median_abs(steady, m) for m in METRIC_NAMES}


def _pct(x: float) -> str:
    return "" if not isinstance(x, float) or math.isnan(x) else f"{100 * x:+.1f}%"


def table(rows: list[dict[str, Any]]) -> str:
    """The errors as a Markdown table, then the steady stages' medians."""
    floors = [k for k in ("host0_tpot", "host0_e2e_mean") if any(k in r for r in rows)]
    head = ["run", "steady", "sustained", "TTFT growth", *METRIC_NAMES, *floors]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["run"], "yes" if r["steady"] else "overloaded",
                 "yes" if r["sustained"] else "no", f"{r['ttft_growth']:.2f}x",
                 *(_pct(r.get(m, math.nan)) for m in (*METRIC_NAMES, *floors))]
        lines.append("| " + " | ".join(cells) + " |")
    med = medians(rows)
    steady = [r for r in rows if r["steady"]]
    lines.append("| median abs, steady | | | | " + " | ".join(
        f"{100 * v:.1f}%" for v in (*(med[m] for m in METRIC_NAMES),
                                    *(median_abs(steady, k) for k in floors))) + " |")
    return "\n".join(lines)


def write(rows: list[dict[str, Any]], out: Path, note: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    order = ["run", "stage", "steady", "sustained", "ttft_growth", *METRIC_NAMES]
    columns = sorted({k for r in rows for k in r},
                     key=lambda k: (order.index(k) if k in order else 99, k))
    with (out / "errors.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    (out / "errors.md").write_text(
        "# servesim against real vLLM runs: signed errors (predicted - measured) / measured\n\n"
        f"{note}\n\n{table(rows)}\n")
    return [out / "errors.csv", out / "errors.md"]


def plot(runs: list[RealRun], results: list[list[dict[str, Any]]], path: Path) -> None:
    """Predicted against measured, one point per run per metric, on a log-log diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    lo, hi = math.inf, 0.0
    for metric in METRIC_NAMES:
        xs = [run.measured[metric] for run in runs]
        ys = [r[0]["figures"][metric] for r in results]
        ax.scatter(xs, ys, label=metric, s=18)
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
    for f in (0.8, 1.2):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.5, ls="--")
    ax.set(xscale="log", yscale="log", xlabel="measured on the real server",
           ylabel="servesim", title="servesim vs real vLLM on H100 (dashed: +/-20%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _shown(path: Path) -> str:
    """A written file's path as printed: relative to the checkout when inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR,
                        help="folder holding h100_vllm_runs.csv (default calibration/real_runs)")
    parser.add_argument("--out", type=Path, default=OUT, help="where errors.csv/.md go")
    parser.add_argument("--plot", type=Path, help="also draw predicted vs measured here (PNG)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per run (noise floor)")
    parser.add_argument("--duration-s", type=float, help="shorten every stage (quick look)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="latency.<field>= or scheduler.<field>= on every run (ablation)")
    parser.add_argument("--note", default="servesim's defaults.", help="errors.md's first line")
    parser.add_argument("--floors", action="store_true",
                        help="also the host = 0 floor (both host terms 0) beside each run's "
                             "errors, and one run's spread over 3 seeds")
    args = parser.parse_args(argv)
    try:
        runs = read_runs(args.dir)
    except FileNotFoundError as e:
        print(f"real_runs: {e}", file=sys.stderr)
        return 2
    latency, scheduler = _overrides(args.set)
    results = evaluate(runs, args.seeds, args.duration_s, latency, scheduler)
    rows = error_rows(runs, results)
    if args.floors:
        floor = evaluate(runs, 1, args.duration_s, {**latency, "step_overhead_ms": 0,
                                                    "seq_overhead_ms": 0}, scheduler)
        for row, run, r in zip(rows, runs, floor, strict=True):
            e = signed_errors(r[0]["figures"], run.measured)
            row["host0_tpot"], row["host0_e2e_mean"] = e["tpot"], e["e2e_mean"]
        one = next(r for r in runs if r.steady)
        spread = error_rows([one], evaluate([one], 3, args.duration_s, latency, scheduler))[0]
        print(f"noise floor: {one.name} at 3 seeds: TTFT p50, TPOT, E2E mean spread "
              f"{100 * spread['ttft_p50_seed_spread']:.2f}, {100 * spread['tpot_seed_spread']:.2f}"
              f", {100 * spread['e2e_mean_seed_spread']:.2f} points (constant arrivals, fixed "
              "lengths and a fixed prompt cycle leave a seed nothing to draw)")
    print(table(rows))
    for path in write(rows, args.out, args.note):
        print(f"wrote {_shown(path)}")
    if args.plot is not None:
        plot(runs, results, args.plot)
        print(f"wrote {_shown(args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
