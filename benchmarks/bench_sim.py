"""Simulator speed and memory: simulated requests per wall-second and peak RSS.

Azure-2023-conversation lengths (builtin:azure_conv, sampled with
replacement), Poisson arrivals, continuous
batching, Llama-3-8B on one H100 with the roofline model. Each point runs in
a fresh process so its peak RSS is its own.

    python benchmarks/bench_sim.py                 # N = 1k, 10k, 100k
    python benchmarks/bench_sim.py --n 1000000 --rates 2
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def scenario_dict(num_requests: int, rate: float) -> dict:
    trace = "builtin:azure_conv"
    lengths = {"prompt_tokens": {"dist": "empirical", "trace": trace, "column": "prompt"},
               "output_tokens": {"dist": "empirical", "trace": trace, "column": "output"}}
    return {"name": "bench", "workload": {"arrivals": {"process": "poisson", "rate": rate},
                                         "num_requests": num_requests, **lengths}}


def one_point(num_requests: int, rate: float) -> dict:
    from sim.config.scenario import Scenario
    from sim.experiments.run import run_scenario

    scenario = Scenario.model_validate(scenario_dict(num_requests, rate))
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    result = run_scenario(scenario, show_progress=False)
    wall_s = time.perf_counter() - started
    s = result.summary
    return {"n": num_requests, "rate": rate, "wall_s": wall_s,
            "sim_req_per_wall_s": num_requests / wall_s,
            "steps": s["num_steps"], "steps_per_wall_s": s["num_steps"] / wall_s,
            "mean_batch": s["mean_batch_size"], "sim_duration_s": s["duration"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_after_setup_mib": rss_before_kib / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--rates", type=float, nargs="+", default=[200.0, 2.0],
                        help="req/s; 200 saturates one H100 on these lengths")
    parser.add_argument("--point", nargs=2, type=float, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.point:
        print(json.dumps(one_point(int(args.point[0]), args.point[1])))
        return
    rows = []
    header = (f"{'N':>9} {'rate':>6} {'wall s':>8} {'sim req/s':>10} {'steps/s':>9} "
              f"{'mean batch':>10} {'peak RSS MiB':>12}")
    print(header)
    for rate in args.rates:
        for n in args.n:
            out = subprocess.run([sys.executable, __file__, "--point", str(n), str(rate)],
                                 check=True, capture_output=True, text=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{n:>9} {rate:>6g} {row['wall_s']:>8.2f} {row['sim_req_per_wall_s']:>10.0f} "
                  f"{row['steps_per_wall_s']:>9.0f} {row['mean_batch']:>10.1f} "
                  f"{row['peak_rss_mib']:>12.0f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
