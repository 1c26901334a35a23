"""The fitted roofline's terms obey their physics (no measured data needed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.config.catalogue import HARDWARE, get_hardware, get_model
from sim.core.plan import StepShape
from sim.latency.roofline import RooflineLatency, model_dims
from sim.latency.roofline_fits import FAMILIES, family_of, params_for
from sim.latency.roofline_terms import (
    attention_costs,
    cpu_overhead_s,
    decode_attention_s,
    gemm_cost,
    gemm_s,
    prefill_attention_s,
    soft_max,
)

H100 = get_hardware("h100-sxm")
P = params_for("h100-sxm")
F, B = H100.bf16_flops_per_s, H100.memory_bandwidth_bytes_per_s


def test_soft_max_lies_between_max_and_sum() -> None:
    a, b = np.array([1.0, 2.0, 0.0, 5.0]), np.array([3.0, 2.0, 0.0, 0.1])
    s = soft_max(a, b, 3.0)
    assert np.all(s >= np.maximum(a, b) - 1e-12) and np.all(s <= a + b + 1e-12)
    assert soft_max(2.0, 0.0, 3.0) == 2.0 and soft_max(0.0, 0.0, 3.0) == 0.0
    assert soft_max(1.0, 1.0, 1.0) == pytest.approx(2.0)
    assert soft_max(1.0, 3.0, 200.0) == pytest.approx(3.0, rel=1e-3)


def test_gemm_is_monotone_flat_then_linear() -> None:
    rows = np.arange(1, 8193, dtype=float)
    t = gemm_s(rows, 4096, 14336 * 2, F, B, P)
    assert np.all(np.diff(t) > 0)
    # memory-bound: 1 and 16 rows cost nearly the same; compute-bound: 4k -> 8k doubles
    assert t[15] < 1.1 * t[0]
    assert t[8191] / t[4095] == pytest.approx(2.0, rel=0.05)
    # the transition is measured, not ideal: at the ideal crossover the GEMM is slower than max
    ideal = 4096 * 28672 * 2 / (B * P.bandwidth_efficiency)
    crossover = int(ideal * F * P.compute_efficiency / (2 * 4096 * 28672))
    assert t[crossover] > 1.05 * ideal


def test_prefill_is_compute_bound_and_decode_memory_bound() -> None:
    roof = RooflineLatency(get_model("llama-3-8b"), H100)
    prefill = roof.breakdown(StepShape((4096,), (0,)))
    decode = roof.breakdown(StepShape(num_decodes=8, decode_context_sum=8000,
                                      decode_context_max=1000, padded_batch=8))
    assert prefill["compute_s"] > 2 * prefill["memory_s"]
    assert decode["memory_s"] > 10 * decode["compute_s"]


def test_gemm_compute_goes_by_padded_tiles() -> None:
    """Past the memory-bound rows a GEMM's time steps at each tile of rows: 129 to 256 rows
    fill two tiles of 128 rows and cost nearly alike, 257 rows start a third."""
    cost = gemm_cost(8192, 28672 * 2, F, B, P)
    tile = P.gemm_tile_rows
    full, next_row = cost.seconds(2 * tile), cost.seconds(2 * tile + 1)
    assert full < 1.05 * cost.seconds(tile + 1)
    assert next_row > 1.15 * full


def test_gemm_compute_goes_by_waves_of_tiles() -> None:
    """With HBM out of the way (bandwidth ~ infinite) a GEMM too narrow to fill the GPU
    costs one wave for every row count whose tiles fit on the SMs at once."""
    p = dataclasses.replace(P, gemm_tile_rows=128, gemm_tile_cols=128, gemm_wave_tiles=132)
    cost = gemm_cost(4096, 1024, F, 1e30, p)  # 8 column tiles: 16 row tiles a wave
    one_wave = cost.seconds(1.0)
    assert cost.seconds(16 * 128.0) == pytest.approx(one_wave, rel=1e-9)
    assert cost.seconds(16 * 128.0 + 1) - p.gemm_launch_s == pytest.approx(
        2 * (one_wave - p.gemm_launch_s), rel=1e-9)


def test_decode_attention_is_bandwidth_bound_and_grows_with_kv() -> None:
    dims = model_dims(get_model("llama-3-8b"), 1)
    kv_bytes_per_token = 2 * dims.kv_dim * 2
    flops_per_pair = 4 * dims.q_dim
    times = [decode_attention_s(64 * kv * flops_per_pair, 64 * kv * kv_bytes_per_token, F, B, P)
             for kv in (1024, 4096, 16384)]
    assert times[0] < times[1] < times[2]
    big = 64 * 16384 * kv_bytes_per_token / (B * P.attention_bandwidth_efficiency)
    assert times[2] == pytest.approx(big + P.decode_attention_launch_s, rel=1e-3)


def test_attention_kernels_take_at_least_their_minimum_and_prefill_its_launch() -> None:
    assert decode_attention_s(1.0, 1.0, F, B, P) == P.attention_min_s
    assert prefill_attention_s(1.0, 1.0, F, B, P) == pytest.approx(
        max(P.attention_min_s, P.prefill_attention_launch_s), rel=1e-6)
    flops = 4096 * 4096 / 2 * 4 * 4096  # a 4k prompt's causal pairs, 32 heads x 128
    compute = flops / (F * P.attention_compute_efficiency)
    assert prefill_attention_s(flops, 4096 * 2048.0, F, B, P) == pytest.approx(
        P.prefill_attention_launch_s + compute, rel=1e-9)


def test_cpu_overhead_has_a_step_and_a_sequence_term() -> None:
    assert cpu_overhead_s(0, P) == P.cpu_step_s
    assert cpu_overhead_s(100, P) - cpu_overhead_s(50, P) == pytest.approx(50 * P.cpu_seq_s)


@pytest.mark.parametrize(("field", "value"), [
    ("bandwidth_efficiency", 1.2), ("compute_efficiency", 0.0), ("transition_sharpness", 0.5),
    ("gemm_launch_s", -1e-6), ("cpu_seq_s", float("inf")), ("gemm_tile_rows", 0.0),
    ("gemm_wave_tiles", float("inf")), ("attention_min_s", -1.0),
])
def test_bad_constants_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(P, **{field: value})


def test_every_catalogue_gpu_names_its_family_and_why() -> None:
    for name in HARDWARE:
        family, why = family_of(name)
        assert family in FAMILIES and why
    assert "no measured kernels" in family_of("h200")[1]
    assert "fitted on measured" in family_of("a100-80gb")[1]
    assert family_of("my-gpu")[0] == "hopper" and "custom" in family_of("my-gpu")[1]


def test_the_simulators_float_path_is_the_law() -> None:
    """GemmCost.seconds (plain floats, the hot path) equals the array law, both regimes."""
    cost = gemm_cost(4096, 28672, F, B, P)
    rows = np.array([0.0, 1.0, 37.0, 128.0, 500.0, 4096.0, 65536.0])
    assert [cost.seconds(float(r)) for r in rows] == pytest.approx(list(cost(rows)), rel=1e-12)
    assert cost.seconds(64.0) == pytest.approx(gemm_s(64.0, 4096, 28672, F, B, P), rel=1e-12)


def test_the_simulators_attention_path_is_the_law() -> None:
    """AttentionCost.seconds (plain floats) equals decode/prefill_attention_s, both regimes."""
    per_pair, per_token = 4 * 4096.0, 2 * 1024 * 2.0
    decode, prefill = attention_costs(per_pair, per_token, F, B, P)
    for pairs, kv in ((1.0, 1.0), (64 * 4097.0, 64 * 4097.0), (8e6, 4096.0)):
        assert decode.seconds(pairs, kv) == pytest.approx(
            decode_attention_s(pairs * per_pair, kv * per_token, F, B, P), rel=1e-12)
        assert prefill.seconds(pairs, kv) == pytest.approx(
            prefill_attention_s(pairs * per_pair, kv * per_token, F, B, P), rel=1e-12)


def test_a_custom_gpu_pads_to_tiles_but_runs_no_waves() -> None:
    """Its SM count is unknown: a wave of hopper's 132 would price a narrow GEMM's few tiles
    at 1/132 of its peak each."""
    assert params_for("my-gpu") == dataclasses.replace(FAMILIES["hopper"], gemm_wave_tiles=1.0)
    assert params_for("h100-sxm") is FAMILIES["hopper"]
    assert "without waves" in family_of("my-gpu")[1]


def test_each_catalogue_gpu_runs_its_waves_as_wide_as_its_own_sms() -> None:
    """The family's fit, but an L4's tiles go 58 at a time, not Ampere's 108: a GEMM of a
    few waves takes longer on it than on an A100 at the same FLOP/s."""
    from sim.config.catalogue import HARDWARE

    for name, hw in HARDWARE.items():
        assert hw.sm_count > 0, name
        assert params_for(name, hw.sm_count).gemm_wave_tiles == hw.sm_count
    a100, l4 = HARDWARE["a100-80gb"], HARDWARE["l4"]
    assert params_for(a100.name, a100.sm_count) == FAMILIES["ampere"]  # what was fitted
    rows = 2048.0
    wide = gemm_cost(4096, 4096, F, B, params_for("l4", 108)).seconds(rows)
    narrow = gemm_cost(4096, 4096, F, B, params_for("l4", l4.sm_count)).seconds(rows)
    assert narrow > wide
    assert "58 SMs" in family_of("my-gpu", 58)[1]


@pytest.mark.parametrize("value", [-1, 1.5, True, "132"])
def test_a_bad_sm_count_is_refused(value: object) -> None:
    from sim.config.catalogue import HARDWARE

    with pytest.raises(ValueError, match="sm_count"):
        dataclasses.replace(HARDWARE["h100-sxm"], sm_count=value)
