"""The validation workloads of the GPU check, written as replay plans (calibrate/gpu/plans/).

    python -m calibrate.gpu.plan            # rewrite calibrate/gpu/plans/*.json
    python -m calibrate.gpu.plan --check    # exit 1 if a committed plan is stale

The GPU machine cannot load scenarios (no pydantic, no simpy), so the
scenarios are turned into plain `ReplayPlan`s here and committed; a test
checks that they still equal what the scenarios give. Each is the first
requests of the Azure LLM 2023 conversation trace (builtin:azure_conv) on an
H200 as this workplace's machines show it (139 GiB), the KV pool at half of
it, with the profile's scheduler budgets; "tiny" is the smoke run's (a CPU host
spec, four requests).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from calibrate.gpu.plain_replay import ReplayPlan, plan_from_scenario

PLAN_DIR = Path(__file__).resolve().parent / "plans"
TRACE = "builtin:azure_conv"
H200_SEEN = {"base": "h200", "name": "NVIDIA H200", "memory_bytes": 139 * 2**30}
CPU_HOST = {"name": "cpu-host", "bf16_flops_per_s": 5.0e10, "memory_bytes": 268435456,
            "memory_bandwidth_bytes_per_s": 1.0e10,
            "interconnect_bandwidth_bytes_per_s": 1.0e10,
            "host_link_bandwidth_bytes_per_s": 1.0e10}
# model -> (GPU, requests, time scale, max_num_seqs, max_num_batched_tokens, max_model_len)
WORKLOADS: dict[str, tuple[dict[str, Any], int, float, int, int, int]] = {
    "llama-3-8b": (H200_SEEN, 200, 2.0, 128, 2048, 8192),
    "qwen2.5-1.5b": (H200_SEEN, 200, 2.0, 128, 2048, 8192),
    "tiny": (CPU_HOST, 4, 16.0, 16, 256, 2048),
}


def raw_scenario(model: str) -> dict[str, Any]:
    gpu, requests, time_scale, seqs, tokens, max_len = WORKLOADS[model]
    return {
        "name": f"gpu_check_{model}", "seed": 0, "model": model,
        "hardware": {"gpu": gpu, "memory_utilization": 0.5},
        # the engine steps synchronously (sim.core.drive), so its scenario says so
        "scheduler": {"policy": "continuous", "max_num_seqs": seqs,
                      "max_num_batched_tokens": tokens, "max_model_len": max_len,
                      "async_scheduling": False},
        "kv": {"block_size": 16},
        "engine": {"device": "auto", "dtype": "auto", "cuda_graphs": True,
                   "sampling": {"temperature": 0.0}},
        "workload": {"trace": {"path": TRACE, "time_scale": time_scale},
                     "num_requests": requests},
        "slo": {"ttft_ms": 500, "tpot_ms": 50},
    }


def make_plan(model: str) -> ReplayPlan:
    from sim.config.loader import validate_scenario

    raw = raw_scenario(model)
    return plan_from_scenario(validate_scenario(raw, f"gpu_check scenario for {model}"), raw)


def load_plan(model: str, plan_dir: Path = PLAN_DIR) -> ReplayPlan:
    return ReplayPlan.from_json((plan_dir / f"{model}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate.gpu.plan",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for model in WORKLOADS:
        text = make_plan(model).to_json()
        path = PLAN_DIR / f"{model}.json"
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            PLAN_DIR.mkdir(exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale replay plans: {', '.join(stale)}; run python -m calibrate.gpu.plan",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
