"""Fit servesim's three serving-system terms on real vLLM runs, leave one model out.

    python -m calibrate.fit_serving [DIR] [--duration-s 100] [--json calibrate/serving_fit.json]

The kernel terms stay fitted on kernels (calibrate.published.fit_roofline); the
link constants come from published all-reduce measurements (sim/config/data/
links.json). What is left between a step's kernels and what a client of a real
server sees is three system terms, fitted here and nowhere else:

- `host_step_s`: the host's time per engine step (scheduling, input preparation,
  output processing); the per-sequence term stays Vidur's measured one;
- `host_serial_share`: under async scheduling, the share of it still serial with
  the GPU (the rest overlaps it, sim.latency.roofline_terms.visible_host_s);
- `api_server_s`: the HTTP/API server's time per request (sim.config.frontend).

No term depends on the run, the model, its size, its TP or the rate: one value
each, for every GPU. The fit is a grid over the first two (each point a
simulation of every steady stage, shortened to `--duration-s`) and, per point,
a scan of the third, which adds to every TTFT and end-to-end latency and moves
no decision (an engine timeline shifted, not changed). The loss is the sum of
squared log errors of TPOT, E2E mean and TTFT p50 over the steady stages.

Leave one model out: for each of the 4 models, the terms are fitted on the other
three models' stages and that model's stages are predicted with them; the train
and held-out errors are printed. The terms over all four models are the ones
servesim ships (sim.latency.roofline_fits, sim.config.frontend); each fold's
terms go to `--json`, which tests/test_real_runs.py reads to check the held-out
bounds. Fits nothing on any other data: the runs folder is the one input.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

from calibrate.real_runs import (
    DEFAULT_DIR,
    METRIC_NAMES,
    RealRun,
    median_abs,
    read_runs,
    signed_errors,
    simulate_row,
)

FIT_FILE = Path(__file__).resolve().parent / "serving_fit.json"
HOST_STEP_MS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.5)
SERIAL_SHARE = (0.0, 0.05, 0.1, 0.2)
API_SERVER_MS = tuple(x / 4 for x in range(0, 81))  # 0 .. 20 ms by 0.25
LOSS_METRICS = ("tpot", "e2e_mean", "ttft_p50")
# the API server's constant adds to these; TPOT and throughput do not move
SHIFTED = ("ttft_mean", "ttft_p50", "ttft_p99", "e2e_mean", "e2e_p50")


@dataclass(frozen=True, slots=True)
class Terms:
    """One fit's three system terms."""

    host_step_ms: float
    host_serial_share: float
    api_server_ms: float

    def latency(self) -> dict[str, float]:
        return {"step_overhead_ms": self.host_step_ms,
                "host_serial_share": self.host_serial_share}


def _simulate(args: tuple[RealRun, float, float, float | None]) -> dict[str, float]:
    run, host_ms, share, duration_s = args
    predicted = simulate_row(run, 0, duration_s, {"step_overhead_ms": host_ms,
                                                  "host_serial_share": share},
                             frontend={"api_server_ms": 0.0})
    return dict(predicted.figures)


def shifted(figures: Mapping[str, float], api_ms: float) -> dict[str, float]:
    """`figures` with the API server's constant added where a client would see it."""
    return {k: v + api_ms if k in SHIFTED else v for k, v in figures.items()}


def loss(runs: Sequence[RealRun], figures: Sequence[Mapping[str, float]], api_ms: float
         ) -> float:
    total = 0.0
    for run, f in zip(runs, figures, strict=True):
        g = shifted(f, api_ms)
        total += sum(math.log(g[m] / run.measured[m]) ** 2 for m in LOSS_METRICS)
    return total


def best(runs: Sequence[RealRun], grid: Mapping[tuple[float, float], Sequence[dict]],
         keep: Sequence[int]) -> tuple[Terms, float]:
    """The grid point and API constant of least loss over runs `keep`."""
    chosen, least = Terms(0, 0, 0), math.inf
    sub = [runs[i] for i in keep]
    for (host_ms, share), figures in grid.items():
        picked = [figures[i] for i in keep]
        for api_ms in API_SERVER_MS:
            value = loss(sub, picked, api_ms)
            if value < least:
                chosen, least = Terms(host_ms, share, api_ms), value
    return chosen, least


def run_grid(runs: Sequence[RealRun], duration_s: float | None, progress: bool = True
             ) -> dict[tuple[float, float], list[dict]]:
    """Every (host_step_ms, serial share) point simulated on every run, in parallel."""
    from tqdm import tqdm

    points = list(itertools.product(HOST_STEP_MS, SERIAL_SHARE))
    jobs = [(run, h, s, duration_s) for h, s in points for run in runs]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        out = list(tqdm(pool.map(_simulate, jobs, chunksize=2), total=len(jobs),
                        desc="fit_serving grid", unit="sim", disable=not progress,
                        file=sys.stderr))
    n = len(runs)
    return {p: out[i * n:(i + 1) * n] for i, p in enumerate(points)}


def _errors(runs: Sequence[RealRun], figures: Sequence[Mapping[str, float]], api_ms: float
            ) -> list[dict[str, float]]:
    return [signed_errors(shifted(f, api_ms), r.measured) for r, f in zip(runs, figures,
                                                                          strict=True)]


def _line(label: str, errors: Sequence[Mapping[str, float]]) -> str:
    return f"{label:<34}" + "".join(f"{100 * median_abs(errors, m):>9.1f}%"
                                    for m in METRIC_NAMES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--duration-s", type=float, default=100.0,
                        help="each stage shortened to this for the grid (default 100)")
    parser.add_argument("--json", type=Path, default=FIT_FILE, help="where the terms go")
    args = parser.parse_args(argv)
    try:
        runs = [r for r in read_runs(args.dir) if r.steady]
    except FileNotFoundError as e:
        print(f"fit_serving: {e}", file=sys.stderr)
        return 2
    grid = run_grid(runs, args.duration_s)
    models = sorted({r.short_model for r in runs})
    print(f"{'':<34}" + "".join(f"{m:>10}" for m in METRIC_NAMES))
    folds: dict[str, dict] = {}
    held_out: list[dict[str, float]] = [{}] * len(runs)
    for model in models:
        train = [i for i, r in enumerate(runs) if r.short_model != model]
        test = [i for i, r in enumerate(runs) if r.short_model == model]
        terms, _ = best(runs, grid, train)
        figures = grid[(terms.host_step_ms, terms.host_serial_share)]
        train_err = _errors([runs[i] for i in train], [figures[i] for i in train],
                            terms.api_server_ms)
        test_err = _errors([runs[i] for i in test], [figures[i] for i in test],
                           terms.api_server_ms)
        for i, e in zip(test, test_err, strict=True):
            held_out[i] = e
        folds[model] = asdict(terms)
        print(f"fold without {model}: {terms}")
        print(_line("  train (3 models)", train_err))
        print(_line(f"  held out ({model})", test_err))
    print(_line("held out, all folds", held_out))
    terms, _ = best(runs, grid, range(len(runs)))
    figures = grid[(terms.host_step_ms, terms.host_serial_share)]
    print(f"all four models: {terms}")
    print(_line("  train (all)", _errors(runs, figures, terms.api_server_ms)))
    args.json.write_text(json.dumps({
        "fitted_on": f"{args.dir.name}/h100_vllm_runs.csv: {len(runs)} steady stages of "
                     f"{len(models)} models (inference-sim/training ed5c1d26900e)",
        "date": date.today().isoformat(), "grid_duration_s": args.duration_s,
        "terms": asdict(terms), "folds": folds}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
