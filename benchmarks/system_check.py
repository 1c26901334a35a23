"""Issue 20 item 5: the fitted default against an imported real-GPU table, whole system.

    python benchmarks/system_check.py [--requests 2000] [--rates 2,1]

CodeLlama-34B at tp 2 on A100-80GB, Azure conversation lengths (sampled from
builtin:azure_conv), Poisson arrivals at 2 req/s, 128 sequences, 4,096
tokens a step, no chunked prefill. Runs it once on the default roofline and
once on a table imported from Vidur's A100 CodeLlama-34B profile (mlp.csv,
its one attention.csv, its CPU overheads for the model), and prints TPOT and
E2EL p50 of both and their ratio, at the issue's 2 req/s and at a lighter
load (where neither run queues for long, so the ratio shows the latency
models rather than how close each is to saturation). Needs the fetched tables under
calibration/measured/ (see its README; they are not committed): without
them it says which file is missing and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from calibrate.published.import_profile import import_profile
from sim.config.catalogue import get_hardware, get_model
from sim.config.scenario import Scenario
from sim.experiments.run import run_scenario
from sim.latency.table_format import TableError

ROOT = Path(__file__).resolve().parents[1] / "calibration" / "measured" / "vidur"
PROFILE = ROOT / "compute" / "a100" / "codellama" / "CodeLlama-34b-Instruct-hf"
ATTENTION = ROOT / "attention" / "a100" / "attention.csv"
CPU = ROOT / "cpu_overheads" / "a100" / "cpu_overheads.csv"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
FIGURES = ("median_ttft_ms", "median_tpot_ms", "median_e2el_ms")


def scenario(requests: int, latency: dict, rate: float = 2.0) -> Scenario:
    lengths = {"dist": "empirical", "trace": "builtin:azure_conv", "format": "azure"}
    return Scenario.model_validate({
        "model": "codellama-34b", "hardware": {"gpu": "a100-80gb", "count": 2}, "seed": 0,
        "latency": latency,
        "scheduler": {"max_num_seqs": 128, "max_num_batched_tokens": 4096,
                      "chunked_prefill": False},
        "workload": {"arrivals": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {**lengths, "column": "prompt"},
                     "output_tokens": {**lengths, "column": "output"},
                     "num_requests": requests}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rates", default="2,1", help="arrival rates, req/s (default 2,1)")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    for path in (PROFILE / "mlp.csv", ATTENTION, CPU):
        if not path.is_file():
            print(f"error: {path}: missing; calibration/measured/README.md says how to fetch "
                  f"it", file=sys.stderr)
            return 2
    print(f"| req/s | run | {' | '.join(FIGURES)} |\n|---|---|" + "---:|" * len(FIGURES))
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "codellama-34b-a100-tp2"
        try:
            import_profile("vidur", PROFILE, get_model("codellama-34b"),
                           get_hardware("a100-80gb"), table, tp=2, attention=ATTENTION,
                           cpu_overheads=CPU, commit=VIDUR_COMMIT)
        except TableError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        runs = {"imported table": {"model": "table", "path": table.name},
                "default roofline": {}}
        for rate in rates:
            results = {name: run_scenario(scenario(args.requests, lat, rate), Path(tmp),
                                          show_progress=False).summary
                       for name, lat in runs.items()}
            for name, summary in results.items():
                print(f"| {rate:g} | {name} | "
                      + " | ".join(f"{summary[f]:.1f}" for f in FIGURES) + " |")
            ref = results["imported table"]
            print(f"| {rate:g} | default / table | " + " | ".join(
                f"{results['default roofline'][f] / ref[f]:.3f}" for f in FIGURES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
