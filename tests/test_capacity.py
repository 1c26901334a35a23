"""`servesim capacity` through argparse: numbers, formulas, errors and exit codes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sim.cli.capacity import register
from sim.cli.capacity_sheet import format_report
from sim.config.capacity import capacity_report, smallest_fitting_tp
from sim.config.catalogue import get_hardware, get_model, hardware_from_fields

GIB = 1024**3


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    register(sub)
    args = parser.parse_args(["capacity", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = run_cli([*argv, "--json"], capsys)
    assert code == 0 and err == ""
    return json.loads(out)


def test_llama3_8b_defaults_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(["--model", "llama-3-8b"], capsys)
    assert report["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131072
    assert report["kv_bytes_context_batch"] == 32 * GIB  # 128 KiB x 8192 x 32
    assert (report["context_tokens"], report["batch_size"], report["gpu"]) == (
        8192, 32, "h100-sxm")
    budget = (report["gpu_memory_bytes"] * 0.9 - report["weights_bytes_per_gpu"]
              - report["activation_reserve_bytes"])
    assert report["kv_budget_bytes"] == pytest.approx(budget)
    assert report["kv_budget_tokens"] == int(budget // (131072 * 16)) * 16
    assert report["max_concurrency"] == report["kv_budget_tokens"] // 8192
    assert report["batch_fits"] is (report["max_concurrency"] >= 32)
    assert report["kv_to_weights_ratio"] == pytest.approx(32 * GIB / 16.06e9, rel=0.01)
    assert report["crossover_batch"] is None  # GQA decode at 8k never turns compute-bound


def test_llama3_70b_weights_split_over_eight_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(["--model", "llama-3-70b", "--gpus", "8"], capsys)
    assert report["weights_bytes_per_gpu"] == pytest.approx(70.6e9 * 2 / 8, rel=0.01)
    assert report["kv_bytes_per_token"] == 2 * 80 * 1 * 128 * 2


def test_text_shows_formulas_with_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["--model", "llama-3-8b"], capsys)
    assert code == 0 and err == ""
    assert "32 layers x 2 x 8 kv_heads x 128 head_dim x bf16 2 B = 131,072 B" in out
    assert "1.00 GiB per 8,192-token sequence in KV bf16 x 32 seqs = 32.00 GiB" in out
    assert "weights bf16 2 B" in out and "KV bf16 2 B" in out
    for label in ("weights", "KV budget", "max concurrency", "decode floor", "crossover",
                  "KV / weights"):
        assert any(line.startswith(label) for line in out.splitlines()), label
    assert " ms per step at batch 32" in out


def test_batch_and_context_move_the_right_terms(capsys: pytest.CaptureFixture[str]) -> None:
    small = run_json(["--context", "1024", "--batch", "8"], capsys)
    large = run_json(["--context", "4096", "--batch", "8"], capsys)
    assert large["kv_bytes_context_batch"] == 4 * small["kv_bytes_context_batch"]
    assert large["max_concurrency"] < small["max_concurrency"]
    assert large["decode_step_floor_s"] > small["decode_step_floor_s"]
    assert small["weights_bytes_per_gpu"] == large["weights_bytes_per_gpu"]
    fp8 = run_json(["--context", "1024", "--batch", "8", "--kv-dtype", "fp8"], capsys)
    assert fp8["kv_bytes_per_token"] == small["kv_bytes_per_token"] / 2
    assert fp8["weights_bytes_per_gpu"] == small["weights_bytes_per_gpu"]  # KV apart


def test_short_context_reports_a_finite_crossover(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(["--model", "llama-3-70b", "--gpus", "8", "--context", "1024"], capsys)
    assert 1 < report["crossover_batch"] < 10_000
    code, out, _ = run_cli(["--model", "llama-3-70b", "--gpus", "8", "--context", "1024"],
                           capsys)
    assert code == 0 and f"batch {report['crossover_batch']:,.1f}" in out


def test_weights_only_crossover_comes_before_any_context(
        capsys: pytest.CaptureFixture[str]) -> None:
    """KV reads only add memory traffic, so context can only delay the crossover."""
    short = run_json(["--model", "llama-3-70b", "--gpus", "8", "--context", "256"], capsys)
    linear = short["crossover_batch_weights_only"]
    assert short["crossover_batch"] is None or short["crossover_batch"] > linear
    # weight-only int4 (W4A16): a quarter of the bytes at bf16's FLOP rate, compute-bound sooner
    int4 = run_json(["--model", "llama-3-70b", "--gpus", "8", "--weight-dtype", "int4"], capsys)
    assert int4["crossover_batch_weights_only"] < linear / 3
    # fp8 weights run on fp8 tensor cores (twice the rate): half the bytes, half the time
    fp8 = run_json(["--model", "llama-3-70b", "--gpus", "8", "--weight-dtype", "fp8"], capsys)
    assert fp8["crossover_batch_weights_only"] == pytest.approx(linear, rel=0.1)


def test_model_too_big_leaves_no_kv(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["--model", "llama-3.1-405b", "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and err == ""
    assert report["kv_budget_bytes"] == 0 and report["max_concurrency"] == 0
    assert report["batch_fits"] is False and report["fits"] is False


def _smaller_valid_tps(model_name: str, below: int) -> list[int]:
    heads = get_model(model_name).num_heads
    return [tp for tp in range(1, below) if heads % tp == 0]


def test_70b_on_one_h100_says_the_weights_do_not_fit_by_how_much_and_the_gpus_needed(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["--model", "llama-3-70b"], capsys)
    assert code == 1 and err == ""
    report = run_cli(["--model", "llama-3-70b", "--json"], capsys)[1]
    r = json.loads(report)
    usable = 80 * GIB * 0.9
    short = r["weights_bytes_per_gpu"] + r["activation_reserve_bytes"] - usable
    assert short > 0 and r["weights_fit"] is False
    assert r["memory_left_bytes"] == pytest.approx(-short)
    fit_line = next(line for line in out.splitlines() if line.startswith("fit"))
    assert "does NOT fit" in fit_line
    assert f"{short / GIB:,.2f} GiB more than the {usable / GIB:,.2f} GiB usable" in fit_line
    assert f"one sequence: --gpus {r['min_gpus_one_sequence']} " in fit_line
    assert f"batch 32: --gpus {r['min_gpus_batch']} " in fit_line
    assert "0 sequences" not in out and "max concurrency" not in out
    # the suggested group is the smallest: it fits, and every smaller valid one does not
    for need, key in ((1, "min_gpus_one_sequence"), (32, "min_gpus_batch")):
        tp = r[key]
        assert run_json(["--model", "llama-3-70b", "--gpus", str(tp)], capsys)[
            "max_concurrency"] >= need
        for smaller in _smaller_valid_tps("llama-3-70b", tp):
            code, out, _ = run_cli(["--model", "llama-3-70b", "--gpus", str(smaller),
                                    "--json"], capsys)
            assert json.loads(out)["max_concurrency"] < need, smaller
    assert r["min_gpus_one_sequence"] <= r["min_gpus_batch"]


def test_weights_fit_but_not_one_sequence_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "llama-3.1-8b", "--context", "512k", "--batch", "1"]
    code, out, _ = run_cli(argv, capsys)
    assert code == 1
    fit_line = next(line for line in out.splitlines() if line.startswith("fit"))
    assert "left after weights and activations" in fit_line
    assert "fewer than the 32,768 of one 524,288-token sequence" in fit_line
    r = json.loads(run_cli([*argv, "--json"], capsys)[1])
    assert r["weights_fit"] is True and r["fits"] is False and r["kv_budget_blocks"] < 32768


def test_a_batch_that_does_not_fit_names_the_gpus_that_hold_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(["--model", "llama-3-8b", "--batch", "100"], capsys)
    assert r["fits"] and not r["batch_fits"] and r["min_gpus_one_sequence"] == 1
    assert run_json(["--model", "llama-3-8b", "--batch", "100", "--gpus",
                     str(r["min_gpus_batch"])], capsys)["batch_fits"]
    out = run_cli(["--model", "llama-3-8b", "--batch", "100"], capsys)[1]
    assert f"(batch 100 does NOT fit; --gpus {r['min_gpus_batch']} " in out


def test_no_tensor_parallel_group_fits_a_gpu_far_too_small() -> None:
    small = hardware_from_fields({"base": "h100-sxm", "memory_bytes": 0.1 * GIB})
    model = get_model("llama-3-8b")
    assert smallest_fitting_tp(model, small, 1, 8192) is None
    text = format_report(capacity_report(model, small))
    assert "one sequence: no tensor-parallel group of up to 32 x h100-sxm (custom) fits" in text


def test_model_field_alone_overrides_the_default_base(capsys: pytest.CaptureFixture[str]) -> None:
    """--help: without --model, --model-field overrides llama-3-8b."""
    r = run_json(["--model-field", "num_layers=40"], capsys)
    assert r["kv_bytes_per_token"] == 2 * 40 * 8 * 128 * 2
    assert r["model"] == "llama-3-8b (custom)" and r["num_layers"] == 40


def test_custom_model_from_fields_and_file(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base = run_json(["--model", "llama-3-8b"], capsys)
    deeper = run_json(["--model", "llama-3-8b", "--model-field", "num_layers=64"], capsys)
    assert deeper["kv_bytes_per_token"] == 2 * base["kv_bytes_per_token"]
    spec = tmp_path / "model.yaml"
    spec.write_text("base: llama-3-8b\nname: my-8b\nnum_kv_heads: 4\n")
    custom = run_json(["--model-file", str(spec)], capsys)
    assert custom["model"] == "my-8b"
    assert custom["kv_bytes_per_token"] == base["kv_bytes_per_token"] / 2


@pytest.mark.parametrize(("argv", "needle"), [
    (["--model", "llama-9b"], "unknown model 'llama-9b'; known: llama-3-8b"),
    (["--gpu", "tpu-v9"], "unknown hardware 'tpu-v9'; known: h100-sxm"),
    (["--gpus", "0"], "--gpus '0': must be a positive integer"),
    (["--gpus", "3"], "--gpus 3: tp=3 must divide num_heads=32"),
    (["--context", "-5"], "--context '-5': must be a positive integer"),
    (["--batch", "many"], "--batch 'many': must be a positive integer"),
    (["--memory-utilization", "1.5"], "--memory-utilization '1.5': must be a fraction"),
    (["--dtype-bytes", "0"], "--dtype-bytes '0': must be 2, 1 or 4 (deprecated: use "
                             "--weight-dtype and --kv-dtype"),
    (["--kv-dtype", "fp6"], "--kv-dtype: unknown dtype 'fp6'; known: fp32, bf16"),
    (["--config", "/nonexistent"], "config '/nonexistent': no such file"),
    (["--config", "builtin:nope"], "no shipped config of that name; known: builtin:"),
    (["--block-size", "0"], "--block-size '0'"),
    (["--model-field", "layers=4"], "unknown ModelSpec field 'layers'"),
    (["--model-field", "num_layers"], "must be KEY=VALUE"),
    (["--model-file", "/nonexistent/model.yaml"], "cannot read"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_format_report_is_pure() -> None:
    report = capacity_report(get_model("tiny"), get_hardware("l40s"), context_tokens=100,
                             batch_size=3, block_size=16)
    assert report["blocks_per_seq"] == 7
    text = format_report(report)
    assert text == format_report(dict(report))
    assert "tiny on 1 x l40s" in text
