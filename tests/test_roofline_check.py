"""The roofline cut to what kernel tables measure equals RooflineLatency's own terms."""

from __future__ import annotations

import pytest

from calibrate.published.kernels import AttentionShape
from calibrate.published.measured import ModelShape
from calibrate.published.roofline_check import (
    Efficiencies,
    ErrorSummary,
    decode_attention_s,
    device_hardware,
    linear_stack_s,
    linear_stack_terms,
    prefill_attention_s,
    shape_dims,
)
from sim.config.catalogue import get_hardware, get_model
from sim.core.plan import StepShape
from sim.latency.roofline import RooflineLatency, model_dims
from sim.latency.roofline_fits import params_for
from sim.latency.roofline_terms import layer_gemms_s, small_kernels_s


def _shape(name: str) -> ModelShape:
    m = get_model(name)
    return ModelShape(m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
                      m.intermediate_size, m.vocab_size, True)


@pytest.mark.parametrize(("name", "tp"), [("llama-3-8b", 1), ("llama-3-8b", 2),
                                          ("llama-3-70b", 4), ("mistral-7b", 8)])
def test_fixture_dims_price_what_roofline_latency_prices(name: str, tp: int) -> None:
    """The check's stack (shape_dims + the terms) is the simulator's own GEMMs and small
    kernels, so an error measured against a fixture is the default's error."""
    model = get_model(name)
    hw = get_hardware("h100-sxm")
    roof = RooflineLatency(model, hw, tp=tp)
    dims = shape_dims(_shape(name), tp)
    assert dims == model_dims(model, tp)
    p = params_for(hw.name)
    for rows in (1, 100, 3000):
        parts = roof.breakdown(StepShape((rows,), (0,)))
        per_layer = (layer_gemms_s(dims, rows, hw.bf16_flops_per_s,
                                   hw.memory_bandwidth_bytes_per_s, p)
                     + small_kernels_s(dims, rows, hw.memory_bandwidth_bytes_per_s, p))
        assert parts["gemm_s"] + parts["small_s"] == pytest.approx(model.num_layers * per_layer)


def test_ungated_mlp_reads_two_matrices() -> None:
    gated = _shape("llama-3-8b")
    ungated = ModelShape(*[getattr(gated, f) for f in gated.__slots__[:-1]], False)
    _, gated_bytes = linear_stack_terms(gated, 1, 0)
    _, ungated_bytes = linear_stack_terms(ungated, 1, 0)
    one_matrix = gated.num_layers * gated.hidden * gated.intermediate * 2
    assert gated_bytes - ungated_bytes == pytest.approx(one_matrix)


def test_stack_is_flat_then_compute_bound() -> None:
    hw = device_hardware("h100")
    shape = _shape("llama-3-8b")
    assert linear_stack_s(shape, 1, 1, hw) == pytest.approx(linear_stack_s(shape, 1, 8, hw),
                                                            rel=0.01)
    big = linear_stack_s(shape, 1, 4096, hw)
    flops, _ = linear_stack_terms(shape, 1, 4096)
    assert big == pytest.approx(flops / (hw.bf16_flops_per_s * 0.6))
    slower = linear_stack_s(shape, 1, 4096, hw, Efficiencies(compute=0.3))
    assert slower == pytest.approx(2 * big)


def test_decode_attention_bandwidth_bound_by_hand() -> None:
    """Issue 20's example: 32-8-128 at tp1, batch 64, 4,096 KV tokens, H100."""
    hw = device_hardware("h100")
    attn = AttentionShape(32, 8, 128, 1)
    kv_bytes = 64 * 4097 * 2 * 8 * 128 * 2
    expected = kv_bytes / (hw.memory_bandwidth_bytes_per_s * 0.8)
    assert decode_attention_s(attn, 64, 4096, hw) == pytest.approx(expected)
    # tp2 halves the KV heads each GPU reads.
    assert decode_attention_s(AttentionShape(32, 8, 128, 2), 64, 4096, hw) == pytest.approx(
        expected / 2)


def test_prefill_attention_is_causal_and_compute_bound() -> None:
    hw = device_hardware("a100")
    attn = AttentionShape(32, 32, 128, 1)
    t = prefill_attention_s(attn, 8192, 0, hw)
    pairs = 8192 * 8193 / 2
    assert t == pytest.approx(pairs * 4 * 32 * 128 / (hw.bf16_flops_per_s * 0.6))
    assert prefill_attention_s(attn, 4096, 4096, hw) > prefill_attention_s(attn, 4096, 0, hw)


def test_unknown_device_is_refused() -> None:
    with pytest.raises(ValueError, match="no catalogue GPU for measured device 'a40'"):
        device_hardware("a40")


def test_error_summary() -> None:
    s = ErrorSummary.of([-0.2, 0.1, 0.05, -0.4, 0.0], [1, 2, 4, 8, 16])
    assert (s.n, s.median, s.worst, s.worst_at) == (5, 0.0, -0.4, 8)
    assert 0.2 < s.p95_abs <= 0.4
    with pytest.raises(ValueError):
        ErrorSummary.of([], [])
