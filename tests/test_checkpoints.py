"""The three checkpoint questions of issue 16, answered by `servesim capacity` and
checked by hand from each model's published architecture (its config.json)."""

from __future__ import annotations

import json

import pytest

from sim.cli import main

GIB = 1024**3


def capacity(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["capacity", *argv, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def test_deepseek_v3_on_8_h200_at_32k_in_fp8(capsys: pytest.CaptureFixture[str]) -> None:
    r = capacity(["--config", "builtin:deepseek-v3", "--gpu", "h200", "--gpus", "8",
                  "--context", "32k", "--batch", "1"], capsys)
    # MLA: one 512-wide latent + one 64-wide rope key per layer, bf16, whole on every GPU
    assert r["kv_bytes_per_token"] == (512 + 64) * 61 * 2 == 70_272
    assert r["weight_dtype"] == "fp8-block"  # the checkpoint's e4m3 with 128x128 scales
    h, tp, fp8, bf16 = 7168, 8, (8 + 32 / (128 * 128)) / 8, 2
    heads = 128 // tp
    attention = (h * 1536 + 1536 + 1536 * heads * (128 + 64)  # q_a, q_a norm, q_b
                 + h * (512 + 64) + 512  # kv_a (latent + rope key), its norm
                 + 512 * heads * (128 + 128)  # kv_b: nope keys and values
                 + heads * 128 * h)  # o_proj
    expert = 3 * h * 2048 / tp
    quantised = 61 * attention + 3 * 3 * h * 18432 / tp + 58 * (256 + 1) * expert
    unquantised = 61 * 2 * h + 58 * h * 256 + h + 2 * 129280 * h / tp  # norms, routers, vocab
    weights = quantised * fp8 + unquantised * bf16
    assert r["weights_bytes_per_gpu"] == pytest.approx(weights)
    activations = 8192 * (4 * h + 48 * 192 + 3 * 2048 * 9 / tp) * 2 + 2 * 256 * 129280 * 4
    assert r["activation_reserve_bytes"] == pytest.approx(activations)
    budget = 141 * GIB * 0.9 - weights - activations
    assert r["max_concurrency"] == int(budget // (70_272 * 32768)) == 21
    fp8_kv = capacity(["--config", "builtin:deepseek-v3", "--gpu", "h200", "--gpus", "8",
                       "--context", "32k", "--batch", "1", "--kv-dtype", "fp8"], capsys)
    assert fp8_kv["kv_bytes_per_token"] == 35_136
    assert fp8_kv["max_concurrency"] == int(budget // (35_136 * 32768)) == 43


def test_gpt_oss_120b_on_one_h100_at_128k(capsys: pytest.CaptureFixture[str]) -> None:
    r = capacity(["--config", "builtin:gpt-oss-120b", "--gpu", "h100-sxm",
                  "--context", "128k", "--batch", "1"], capsys)
    ctx, per_layer = 131072, 2 * 8 * 64 * 2  # 8 KV heads x 64 head_dim, bf16
    assert r["kv_bytes_per_token"] == 36 * per_layer == 73_728
    # 18 full layers hold the whole context, 18 sliding ones their 128-token window
    assert r["kv_bytes_per_seq"] == 18 * ctx * per_layer + 18 * 128 * per_layer
    h = 2880
    experts = 36 * 128 * 3 * h * 2880  # MXFP4: 4 bits + an 8-bit scale per 32
    attention = 36 * (2 * h * 64 * 64 + 2 * h * 8 * 64 + 64 * 64 + 2 * 8 * 64)  # with biases
    rest = 36 * 2 * h + 36 * h * 128 + h + 2 * 201088 * h  # norms, routers, vocab: bf16
    weights = experts * (4 + 8 / 32) / 8 + (attention + rest) * 2
    assert r["weights_bytes_per_gpu"] == pytest.approx(weights)
    assert weights / 1e9 == pytest.approx(65.2, abs=0.1)  # the ~65 GB checkpoint
    budget = 80 * GIB * 0.9 - weights - r["activation_reserve_bytes"]
    assert r["max_concurrency"] == int(budget // r["kv_bytes_per_seq"]) == 2
    # the simulator's pool keeps every sliding block: one sequence fits there
    assert r["pool_max_concurrency"] == int(budget // (36 * ctx * per_layer)) == 1


def test_llama_3_70b_int4_awq_on_one_h100_at_8k(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--model", "llama-3-70b", "--weight-dtype", "int4"],
                 ["--config", "builtin:llama-3.1-70b-awq-int4"]):
        r = capacity([*argv, "--context", "8k", "--batch", "1"], capsys)
        h, layers = 8192, 80
        linear = layers * (2 * h * h + 2 * h * 1024 + 3 * h * 28672)
        # AWQ: 4-bit weights, an fp16 scale and a 4-bit zero per group of 128
        weights = linear * (4 + (16 + 4) / 128) / 8 + (layers * 2 * h + h + 2 * 128256 * h) * 2
        assert r["weights_bytes_per_gpu"] == pytest.approx(weights)
        assert r["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680
        budget = 80 * GIB * 0.9 - weights - r["activation_reserve_bytes"]
        assert r["max_concurrency"] == int(budget // (327_680 * 8192)) == 13
