"""MoE: distinct experts a step touches (closed form, skew), weights under TP and EP,
and expert parallelism's all-to-all."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sim.cli import main
from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import experts_touched, weights_bytes, weights_read_bytes
from sim.config.hf_config import read_hf_config
from sim.config.loader import validate_scenario
from sim.config.moe import (
    all_to_all_bytes_per_gpu,
    expected_distinct_experts,
    experts_touched_per_gpu,
    routing_probabilities,
)
from sim.config.yaml_input import ScenarioError
from sim.core.plan import StepShape
from sim.latency.roofline import RooflineLatency

H100 = get_hardware("h100-sxm")


def test_uniform_routing_closed_form_by_hand() -> None:
    assert expected_distinct_experts(8, 2, 1) == pytest.approx(2)
    assert expected_distinct_experts(8, 2, 4) == pytest.approx(8 * (1 - 0.75**4))  # 5.47
    assert expected_distinct_experts(256, 8, 32) == pytest.approx(256 * (1 - (248 / 256)**32))
    assert expected_distinct_experts(8, 2, 10_000) == pytest.approx(8)
    assert expected_distinct_experts(8, 2, 0) == 0


def test_closed_form_matches_sampled_routing() -> None:
    rng = random.Random(0)
    experts, k, tokens, trials = 64, 4, 24, 4000
    seen = sum(len({e for _ in range(tokens) for e in rng.sample(range(experts), k)})
               for _ in range(trials)) / trials
    assert seen == pytest.approx(expected_distinct_experts(experts, k, tokens), rel=0.01)


def test_skew_touches_fewer_experts() -> None:
    probs = routing_probabilities(16, 4, 1.5)
    assert sum(probs) == pytest.approx(4) and max(probs) <= 1.0
    assert probs == sorted(probs, reverse=True)
    assert routing_probabilities(16, 4, 0.0) == pytest.approx([0.25] * 16)
    uniform = expected_distinct_experts(16, 4, 8)
    assert expected_distinct_experts(16, 4, 8, skew=1.0) < uniform
    assert expected_distinct_experts(16, 4, 8, skew=0.0) == pytest.approx(uniform)


def test_expert_parallelism_reads_a_share_on_each_gpu() -> None:
    assert experts_touched_per_gpu(256, 8, 32, 8) == pytest.approx(
        expected_distinct_experts(256, 8, 32) / 8)
    # skewed: the GPU holding the hot experts reads more than the average share
    assert experts_touched_per_gpu(256, 8, 32, 8, skew=1.0) > expected_distinct_experts(
        256, 8, 32, skew=1.0) / 8
    assert all_to_all_bytes_per_gpu(1024, 8, 7168, 2, 8) == 2 * 1024 / 8 * 8 * 7168 * 2 * 7 / 8
    assert all_to_all_bytes_per_gpu(1024, 8, 7168, 2, 1) == 0


def test_weights_per_gpu_under_tp_and_ep() -> None:
    model = get_model("mixtral-8x7b")
    expert = 32 * 3 * 4096 * 14336 * 2  # one expert, all layers, bf16
    assert weights_bytes(model, tp=4, ep=4) == pytest.approx(weights_bytes(model, tp=4))
    # ep 2 of 4 GPUs: each holds 4 whole experts instead of a quarter of all 8
    assert weights_bytes(model, tp=4, ep=2) - weights_bytes(model, tp=4) == pytest.approx(
        4 * expert - 8 * expert / 4)
    with pytest.raises(ValueError, match="ep=3 must divide num_experts=8"):
        weights_bytes(model, tp=4, ep=3)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        weights_bytes(get_model("llama-3-8b"), tp=2, ep=2)
    assert experts_touched(model, 1) == pytest.approx(2)
    assert weights_read_bytes(model, 1, tp=4, ep=4) < weights_read_bytes(model, 64, tp=4, ep=4)


def test_roofline_adds_an_all_to_all_under_ep() -> None:
    spec = read_hf_config("builtin:deepseek-v3").spec
    decode = StepShape((), (), 64, 64 * 1000, 1000, 64)
    tp_only = RooflineLatency(spec, get_hardware("h200"), tp=8).breakdown(decode)
    ep = RooflineLatency(spec, get_hardware("h200"), tp=8, ep=8).breakdown(decode)
    assert ep["allreduce_s"] != tp_only["allreduce_s"]
    assert ep["bytes"] == pytest.approx(tp_only["bytes"], rel=0.01)  # same reads on average
    skewed = dataclasses.replace(spec, routing_skew=1.0)
    fewer = RooflineLatency(skewed, get_hardware("h200"), tp=8).breakdown(decode)
    assert fewer["bytes"] < tp_only["bytes"]


def test_scenario_expert_parallel_is_checked() -> None:
    scenario = validate_scenario({"model": "mixtral-8x7b",
                                  "hardware": {"count": 4, "expert_parallel": 4}}, "test")
    assert scenario.hardware.expert_parallel == 4
    with pytest.raises(ScenarioError, match="hardware.expert_parallel: ep=4 must divide"):
        validate_scenario({"model": "mixtral-8x7b",
                           "hardware": {"count": 2, "expert_parallel": 4}}, "test")


def test_capacity_reports_weights_under_tp_and_ep(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--model", "mixtral-8x7b", "--gpus", "4", "--ep", "2"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("  TP vs EP"))
    tp = weights_bytes(get_model("mixtral-8x7b"), tp=4)
    assert f"TP slices every expert: {tp / 2**30:,.2f} GiB per GPU" in row
    assert "EP 4 (2 whole experts per GPU)" in row
    assert "experts read" in out and "ep 2" in out
    assert main(["capacity", "--model", "llama-3-8b", "--gpus", "2", "--ep", "2"]) == 2
    assert "--ep 2: ep=2: expert parallelism needs a mixture-of-experts" in capsys.readouterr().err
