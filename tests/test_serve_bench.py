"""`servesim load --rate` sweeps and vLLM bench's JSON result (issue 47 item 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from test_serve import scenario

from sim.serve.bench import bench_result
from sim.serve.load import Measured
from sim.serve.server import BackgroundServer, simulated_served
from sim.text import load_tokenizer

ROOT = Path(__file__).parent.parent
# the keys vLLM 0.32's `vllm bench serve --save-result` writes without --save-detailed,
# for a generative model with the default percentile metrics (ttft, tpot, itl) at p99
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "latencies", "queue_times",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl"))}


def measured() -> list[Measured]:
    a = Measured(0, 10, 3, send_s=0.0, chunk_s=[0.5, 0.7, 1.0], finish_s=1.0, usage_prompt=10,
                 usage_completion=3)
    b = Measured(1, 20, 2, send_s=0.2, due_s=0.1, chunk_s=[1.2, 2.4], finish_s=2.5,
                 usage_prompt=20, usage_completion=2)
    c = Measured(2, 5, 4, send_s=0.3, finish_s=0.4, error="HTTP 400: no")
    return [a, b, c]


def test_bench_result_uses_vllms_formulas() -> None:
    result = bench_result(measured(), "m", "byte", 4.0, None, now=datetime(2026, 1, 2, 3, 4, 5))
    assert set(result) >= VLLM_KEYS
    assert result["date"] == "20260102-030405"
    assert (result["completed"], result["failed"], result["num_prompts"]) == (2, 1, 3)
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (30, 5)
    assert result["duration"] == 2.5
    assert result["request_throughput"] == pytest.approx(2 / 2.5)
    assert result["total_token_throughput"] == pytest.approx(35 / 2.5)
    ttfts, tpots = [0.5, 1.0], [(1.0 - 0.5) / 2, (2.5 - 1.2) / 1]
    itls = [0.2, 0.3, 1.2]
    assert result["mean_ttft_ms"] == pytest.approx(750.0)
    assert result["median_tpot_ms"] == pytest.approx(np.median(tpots) * 1000)
    assert result["std_itl_ms"] == pytest.approx(np.std(itls) * 1000)
    assert result["p99_itl_ms"] == pytest.approx(np.percentile(itls, 99) * 1000)
    assert result["p99_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99) * 1000)
    assert result["queue_times"] == pytest.approx([0.0, 0.1, 0.3])
    # whole seconds from the first send: [0, 1) holds a's 0.5 and 0.7, [1, 2) a's 1.0 and b's
    # 1.2, [2, 3) b's 2.4; a is in flight in seconds 0-1, b in 0-2
    assert (result["max_output_tokens_per_s"], result["max_concurrent_requests"]) == (2.0, 2)
    assert bench_result([], "m", "t", float("inf"), 2)["request_rate"] == "inf"


def test_cli_rate_sweep_writes_a_vllm_bench_file_per_rate(tmp_path: Path) -> None:
    workload = {"arrivals": {"process": "poisson", "rate": 5.0}, "num_requests": 6,
                "prompt_tokens": {"dist": "uniform", "low": 8, "high": 30},
                "output_tokens": {"dist": "uniform", "low": 2, "high": 6}}
    sc = scenario(workload=workload)
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(sc.model_dump(mode="json", exclude_none=True)))
    served = simulated_served(sc, load_tokenizer("byte"))
    with BackgroundServer(served) as url:
        done = subprocess.run([sys.executable, "-m", "sim.cli", "load", url, str(spec),
                               "--rate", "40,inf", "--max-concurrency", "3", "--quiet",
                               "--no-plots", "--out", str(tmp_path / "o")],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for rate, name in ((40.0, "rate-40"), ("inf", "rate-inf")):
        bench = json.loads((tmp_path / "o" / name / "vllm_bench.json").read_text())
        assert set(bench) >= VLLM_KEYS
        assert bench["request_rate"] == rate and bench["max_concurrency"] == 3
        assert bench["completed"] == 6 and bench["failed"] == 0
        assert (tmp_path / "o" / name / "summary.json").is_file()
    assert len(served.loop.recorder.requests_frame()) == 12
    bad = subprocess.run([sys.executable, "-m", "sim.cli", "load", "http://127.0.0.1:9",
                          "--rate", "2,zero", "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--rate" in bad.stderr and "zero" in bad.stderr
