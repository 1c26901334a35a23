"""The merged roofline (issue 20's fitted laws, issue 16's dtypes, MoE, MLA and windows).

A bf16 dense model must price every step exactly as the fitted roofline did before
the dtypes came in, so the fit (calibrate.fit_roofline, test_roofline_vs_measured)
keeps its meaning. The frozen values below were computed on main at 7e17e20 (issue
20's roofline, before issue 16 was merged), not copied from this model's output.
"""

from __future__ import annotations

import dataclasses

import pytest

from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import weights_read_bytes
from sim.config.hf_config import read_hf_config
from sim.core.plan import StepShape
from sim.latency import RooflineLatency

H100, H200 = get_hardware("h100-sxm"), get_hardware("h200")
SHAPES = {
    "prefill": StepShape((512,), (0,)),
    "two chunks": StepShape((256, 1024), (1024, 0)),
    "decode": StepShape(num_decodes=64, decode_context_sum=64 * 2048,
                        decode_context_max=2048, padded_batch=64),
    "padded": StepShape(num_decodes=6, decode_context_sum=6 * 300, decode_context_max=300,
                        padded_batch=8),
    "mixed": StepShape((128,), (0,), num_decodes=32, decode_context_sum=32000,
                       decode_context_max=1000, padded_batch=33),
    "speculative": StepShape(num_decodes=8, decode_context_sum=8 * 500,
                             decode_context_max=500, padded_batch=8, num_spec_decodes=8,
                             num_spec_tokens=24, spec_depth=3, spec_context_sum=8 * 500),
    "swap": StepShape(num_decodes=4, decode_context_sum=4000, decode_context_max=1000,
                      padded_batch=4, swap_out_tokens=64, swap_in_tokens=32),
}
# (model, gpu, tp, shape) -> issue 20's step_time, seconds
BEFORE_ISSUE_16 = {
    ("llama-3-8b", "h100-sxm", 1, "prefill"): 0.017674474419425098,
    ("llama-3-8b", "h100-sxm", 1, "decode"): 0.016777706816876084,
    ("llama-3-8b", "h100-sxm", 1, "mixed"): 0.012734914553179036,
    ("llama-3-8b", "h100-sxm", 1, "padded"): 0.00875234754564562,
    ("llama-3-8b", "h100-sxm", 1, "speculative"): 0.009036605331064932,
    ("llama-3-8b", "h100-sxm", 1, "swap"): 0.00894008049473804,
    ("llama-3-8b", "h100-sxm", 2, "prefill"): 0.011882119543286187,
    ("llama-3-8b", "h100-sxm", 2, "decode"): 0.012088604128119526,
    ("llama-3-8b", "h100-sxm", 2, "mixed"): 0.009564347099799735,
    ("llama-3-8b", "a100-80gb", 1, "prefill"): 0.04172029229214062,
    ("llama-3-8b", "a100-80gb", 1, "decode"): 0.025889720238036727,
    ("llama-3-8b", "a100-80gb", 1, "mixed"): 0.022645617068529626,
    ("llama-3-8b", "a100-80gb", 2, "prefill"): 0.02437529463675914,
    ("llama-3-8b", "a100-80gb", 2, "decode"): 0.016741541064192796,
    ("llama-3-8b", "a100-80gb", 2, "mixed"): 0.014701352892109843,
    ("qwen2.5-7b", "h100-sxm", 2, "two chunks"): 0.019838899420544384,
    ("qwen2.5-7b", "h100-sxm", 2, "mixed"): 0.008624711479738836,
}


@pytest.mark.parametrize(("key", "before_s"), BEFORE_ISSUE_16.items(),
                         ids=[" ".join(map(str, k)) for k in BEFORE_ISSUE_16])
def test_bf16_dense_models_keep_the_fitted_step_times(key: tuple, before_s: float) -> None:
    model, gpu, tp, shape = key
    roof = RooflineLatency(get_model(model), get_hardware(gpu), tp)
    assert roof.step_time(SHAPES[shape]) == pytest.approx(before_s, rel=1e-12, abs=0)


def _decode(batch: int, context: int) -> StepShape:
    return StepShape(num_decodes=batch, decode_context_sum=batch * context,
                     decode_context_max=context, padded_batch=batch)


def test_quantised_weights_shorten_the_memory_bound_gemms() -> None:
    base = get_model("llama-3-8b")
    step = _decode(1, 1024)
    bf16 = RooflineLatency(base, H100).breakdown(step)
    for name in ("fp8", "int4"):
        quantised = RooflineLatency(dataclasses.replace(base, weight_dtype=name), H100)
        parts = quantised.breakdown(step)
        assert parts["gemm_s"] < 0.7 * bf16["gemm_s"]
        # lm_head stays bf16 and the KV dtype is apart: neither moves
        assert parts["lm_head_s"] == bf16["lm_head_s"]
        assert parts["attention_s"] == bf16["attention_s"]
    fp8_kv = RooflineLatency(dataclasses.replace(base, kv_dtype="fp8"), H100)
    long = _decode(64, 4096)
    assert fp8_kv.breakdown(long)["attention_s"] < 0.6 * RooflineLatency(
        base, H100).breakdown(long)["attention_s"]
    assert fp8_kv.breakdown(long)["gemm_s"] == RooflineLatency(base, H100).breakdown(
        long)["gemm_s"]


def test_expert_dtype_prices_only_the_experts() -> None:
    gpt_oss = read_hf_config("builtin:gpt-oss-120b").spec
    assert (gpt_oss.weight_dtype, gpt_oss.expert_dtype) == ("bf16", "mxfp4")
    as_bf16 = dataclasses.replace(gpt_oss, expert_dtype="bf16")
    step = _decode(32, 1024)
    fp4, bf16 = (RooflineLatency(m, H200).breakdown(step) for m in (gpt_oss, as_bf16))
    assert fp4["gemm_s"] < 0.6 * bf16["gemm_s"]
    saved = weights_read_bytes(as_bf16, 32) - weights_read_bytes(gpt_oss, 32)
    assert bf16["bytes"] - fp4["bytes"] == pytest.approx(saved)
    assert fp4["attention_s"] == bf16["attention_s"]


def test_sliding_window_layers_read_at_most_their_window() -> None:
    gpt_oss = read_hf_config("builtin:gpt-oss-120b").spec
    full = dataclasses.replace(gpt_oss, layer_types=(), sliding_window=0)
    short, long = _decode(16, gpt_oss.sliding_window), _decode(16, 32 * 1024)
    windowed, everything = RooflineLatency(gpt_oss, H200), RooflineLatency(full, H200)
    # within the window the two are one model; past it, half the layers stop growing
    assert windowed.breakdown(short)["attention_s"] == pytest.approx(
        everything.breakdown(short)["attention_s"])
    ratio = windowed.breakdown(long)["attention_s"] / everything.breakdown(long)["attention_s"]
    assert 0.45 < ratio < 0.6


def test_moe_decode_reads_its_experts_in_one_fused_kernel_per_matrix() -> None:
    """256 experts, 8 per token: a batch touches most of them, and the GEMMs stay near
    their weight read (one launch per matrix and layer, not one per expert)."""
    deepseek = read_hf_config("builtin:deepseek-v3").spec
    for ep in (1, 8):
        parts = RooflineLatency(deepseek, H200, tp=8, ep=ep).breakdown(_decode(64, 1024))
        weights_s = parts["memory_s"] - parts["attention_s"]
        assert parts["gemm_s"] < 1.5 * weights_s


def test_mla_latent_is_read_whole_on_every_gpu() -> None:
    deepseek = read_hf_config("builtin:deepseek-v3").spec
    step = _decode(64, 8192)
    tp4, tp8 = (RooflineLatency(deepseek, H200, tp=tp).breakdown(step) for tp in (4, 8))
    # memory-bound decode attention: halving the heads per GPU barely helps
    assert tp8["attention_s"] > 0.9 * tp4["attention_s"]
