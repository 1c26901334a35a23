"""Long context: KV memory, latency and admission hold to 128k tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.config.capacity import capacity_report
from sim.config.catalogue import get_hardware, get_model
from sim.config.loader import load_scenario
from sim.core.plan import StepShape
from sim.experiments.run import run_scenario
from sim.experiments.sweep import Backend, sweep
from sim.latency import RooflineLatency
from sim.plots.compare import plot_sweep

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
CTX_128K = 128 * 1024
H100 = get_hardware("h100-sxm")


def _capacity(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["capacity", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_kv_bytes_at_128k_equal_the_hand_value(capsys: pytest.CaptureFixture[str]) -> None:
    m = get_model("llama-3-8b")
    # K and V, per layer, per KV head, per head dim, 2 bytes (bf16), per token
    hand = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2 * CTX_128K
    report = _capacity(["--model", "llama-3-8b", "--context", "128k", "--batch", "1"], capsys)
    assert report["context_tokens"] == CTX_128K
    assert report["kv_bytes_context_batch"] == report["kv_bytes_per_seq"] == hand
    assert report["kv_seq_to_weights_ratio"] == pytest.approx(
        hand / report["weights_bytes_per_gpu"])
    assert report["kv_pool_to_weights_ratio"] == pytest.approx(
        report["kv_budget_tokens"] * report["kv_bytes_per_token"]
        / report["weights_bytes_per_gpu"])
    assert report["context_exceeds_model"]  # Llama-3-8B itself stops at 8k
    assert not _capacity(["--model", "llama-3.1-8b", "--context", "128k"],
                         capsys)["context_exceeds_model"]


def test_capacity_text_shows_every_term_of_the_128k_answer(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--model", "llama-3.1-8b", "--context", "128k", "--batch", "1"]) == 0
    text = capsys.readouterr().out
    report = capacity_report(get_model("llama-3.1-8b"), H100, context_tokens=CTX_128K,
                             batch_size=1)
    for label in ("KV per token", "weights", "KV budget", "max concurrency", "one sequence",
                  "whole KV pool"):
        assert label in text
    assert f"= {report['kv_seq_to_weights_ratio']:,.2f} x the weights" in text
    assert f"({report['max_concurrency']} sequences of 131,072 tokens)" in text
    assert "note" not in text
    assert main(["capacity", "--context", "12q"]) == 2
    assert "--context '12q'" in capsys.readouterr().err


def test_decode_at_128k_pays_for_reading_its_kv() -> None:
    m = get_model("llama-3.1-8b")
    lat = RooflineLatency(m, H100)

    def decode(ctx: int) -> dict[str, float]:
        return lat.breakdown(StepShape(num_decodes=1, decode_context_sum=ctx,
                                       decode_context_max=ctx, padded_batch=1))

    short, long = decode(16384), decode(CTX_128K)  # both past the kernel minimum
    assert long["memory_s"] > long["compute_s"]  # one sequence: memory-bound at any context
    kv_per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2
    extra_s = (CTX_128K - 16384) * kv_per_token / (
        H100.memory_bandwidth_bytes_per_s * lat.fitted.attention_bandwidth_efficiency)
    assert long["total_s"] - short["total_s"] == pytest.approx(extra_s, rel=1e-3)


ENGINE_ONLY = ("frontend.api_server_ms=0", "frontend.tokenize_us_per_token=0",
               "frontend.detokenize_us_per_token=0", "frontend.stream_us_per_token=0")


def _run(*sets: str) -> dict:
    scenario, base = load_scenario(SCENARIOS / "long_context.yaml", list(sets))
    return run_scenario(scenario, base, show_progress=False)


def test_one_128k_request_prefills_in_chunks_priced_at_their_context() -> None:
    prompt, chunk = CTX_128K - 256, 8192
    # the engine's own steps: synchronous, no frontend (which would add 128k tokens' tokenizing)
    result = _run(f"workload.prompt_tokens.value={prompt}", "workload.num_requests=1",
                  "scheduler.async_scheduling=false", *ENGINE_ONLY)
    lat = RooflineLatency(get_model("llama-3.1-8b"), H100)
    starts = range(0, prompt, chunk)
    times = [lat.step_time(StepShape((min(chunk, prompt - s),), (s,), padded_batch=1))
             for s in starts]
    assert all(a < b for a, b in zip(times[:-2], times[1:-1], strict=True))  # attention grows
    row = result.recorder.requests_frame().iloc[0]
    assert row["ttft_ms"] == pytest.approx(sum(times) * 1e3, rel=1e-9)
    decodes = [lat.step_time(StepShape(num_decodes=1, decode_context_sum=c,
                                       decode_context_max=c, padded_batch=1))
               for c in range(prompt, prompt + 255)]
    assert row["tpot_ms"] == pytest.approx(sum(decodes) / 255 * 1e3, rel=1e-9)
    assert result.summary["rejected"] == 0


@pytest.mark.parametrize("full_isl", [True, False])
def test_a_burst_at_128k_never_runs_more_than_memory_holds(full_isl: bool) -> None:
    scenario, base = load_scenario(SCENARIOS / "long_context.yaml",
                                   [f"workload.prompt_tokens.value={CTX_128K - 256}",
                                    "workload.num_requests=6",
                                    f"scheduler.scheduler_reserve_full_isl={str(full_isl).lower()}"])
    result = run_scenario(scenario, base, show_progress=False)
    report = capacity_report(scenario.model_spec, H100, context_tokens=CTX_128K)
    assert result.num_blocks == report["kv_budget_blocks"]  # simulator and CLI: one budget
    summary = result.summary
    assert summary["completed"] == 6 and summary["max_kv_blocks_used"] <= result.num_blocks
    assert report["max_concurrency"] == 3  # 3 whole sequences fit
    if full_isl:  # vLLM's default: a 4th waits until its whole prompt fits
        assert summary["max_num_running"] == 3 and summary["total_preemptions"] == 0
    else:  # vLLM <= 0.18: a 4th holds a partial prefill until it is preempted
        assert summary["max_num_running"] == 4 and summary["total_preemptions"] > 0


def test_too_long_requests_are_rejected_with_a_reason(tmp_path: Path) -> None:
    result = _run("model=llama-3-8b", "workload.prompt_tokens.value=8000",
                  "workload.num_requests=3")
    summary = result.summary
    assert summary["rejected"] == 3 and summary["completed"] == 0
    reason = "prompt+output 8256 > max_model_len 8192"
    assert summary["rejection_reasons"] == {reason: 3}
    frame = result.recorder.requests_frame()
    assert set(frame["rejection_reason"]) == {reason} and set(frame["status"]) == {"rejected"}
    ok = _run("workload.prompt_tokens.value=130816", "workload.num_requests=1").summary
    too_long = _run("workload.prompt_tokens.value=130817", "workload.num_requests=1").summary
    assert (ok["completed"], too_long["rejected"]) == (1, 1)


def test_max_model_len_past_the_model_is_a_config_error(capsys) -> None:
    assert main(["run", "--quiet", "--no-plots", "--set", "scheduler.max_model_len=9000"]) == 2
    err = capsys.readouterr().err
    assert "scheduler.max_model_len: 9000 exceeds llama-3-8b's maximum context of 8192" in err
    assert "Traceback" not in err


def test_sweep_plots_against_context(tmp_path: Path) -> None:
    grid = {"workload.prompt_tokens.value": [1024, 4096],
            "workload.arrivals.rate": [0.5, 100]}
    scenario = tmp_path / "s.yaml"
    text = (SCENARIOS / "long_context.yaml").read_text().replace("num_requests: 32",
                                                                 "num_requests: 4")
    scenario.write_text(text)
    # (sweep(..., plots=True) also writes every point's own plots: slower, and not the point)
    table = sweep(scenario, grid, Backend(jobs=1), None, plots=False, progress=False)
    assert plot_sweep(table, list(grid), tmp_path / "sweep.png").stat().st_size > 10_000
    burst = table[table["workload.arrivals.rate"] == 100]
    assert list(burst["max_num_running"]) == [4, 4]
    assert burst["median_ttft_ms"].is_monotonic_increasing
