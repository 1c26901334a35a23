"""KV bytes per attention kind, each checked by hand, and what max concurrency and the
simulator's pool make of them."""

from __future__ import annotations

import dataclasses

import pytest

from sim.assemble import kv_budget
from sim.config.attention import (
    gqa_layer_bytes_per_token,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    linear_state_bytes,
    mla_layer_bytes_per_token,
    window_tokens,
)
from sim.config.catalogue import get_hardware, get_model
from sim.config.costs import kv_budget_bytes, max_concurrency
from sim.config.hf_config import read_hf_config
from sim.config.loader import validate_scenario
from sim.config.specs import ModelSpec

H100 = get_hardware("h100-sxm")
DEEPSEEK = read_hf_config("builtin:deepseek-v3").spec
GPT_OSS = read_hf_config("builtin:gpt-oss-20b").spec


def test_gqa_and_mqa_by_hand() -> None:
    assert gqa_layer_bytes_per_token(8, 128, 2) == 2 * 8 * 128 * 2
    llama = get_model("llama-3-8b")
    assert kv_bytes_per_token(llama) == 32 * 2 * 8 * 128 * 2
    assert kv_bytes_per_token(llama, tp=4) == 32 * 2 * 2 * 128 * 2
    mqa = dataclasses.replace(llama, num_kv_heads=1)
    assert kv_bytes_per_token(mqa, tp=8) == kv_bytes_per_token(mqa) == 32 * 2 * 128 * 2


def test_mla_caches_the_latent_whole_on_every_gpu() -> None:
    assert mla_layer_bytes_per_token(512, 64, 2) == 1152
    for tp in (1, 8, 16):
        assert kv_bytes_per_token(DEEPSEEK, tp=tp) == (512 + 64) * 61 * 2
    # the GQA formula would have said 2 x 61 x 128 heads x 192 x 2 B: 47 times more
    assert 2 * 61 * 128 * 192 * 2 / kv_bytes_per_token(DEEPSEEK) > 40


def test_sliding_window_layers_stop_at_the_window() -> None:
    assert window_tokens(100, 128) == 100 and window_tokens(5000, 128) == 128
    per_layer = 2 * 8 * 64 * 2
    assert GPT_OSS.layer_types[:2] == ("sliding", "full")
    for ctx in (64, 128, 10_000):
        assert kv_bytes_per_sequence(GPT_OSS, ctx) == (12 * ctx + 12 * min(ctx, 128)) * per_layer
    # whole blocks per layer group: 100 tokens in 16-token blocks hold 112
    assert kv_bytes_per_sequence(GPT_OSS, 100, block_size=16) == (12 * 112 + 12 * 112) * per_layer
    assert kv_bytes_per_sequence(GPT_OSS, 1000, block_size=16) == (12 * 1008 + 12 * 128) * per_layer


def hybrid() -> ModelSpec:
    """Qwen3-Next-like: three linear (Gated DeltaNet) layers per full-attention layer."""
    state = 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3  # recurrent state + conv state
    return ModelSpec("hybrid", 8, 2048, 16, 2, 256, 5120, 151936, 32768, False,
                     layer_types=("linear", "linear", "linear", "full") * 2,
                     linear_state_elements=state)


def test_linear_layers_hold_a_constant_state() -> None:
    model = hybrid()
    state = 32 * 128 * 128 + 8192 * 3
    assert linear_state_bytes(model) == 6 * state * 2
    assert linear_state_bytes(model, tp=2) == 6 * state * 2 / 2
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 256 * 2  # only the two full layers
    for ctx in (1, 1000):
        assert kv_bytes_per_sequence(model, ctx) == 2 * ctx * (2 * 2 * 256 * 2) + 6 * state * 2


def test_max_concurrency_follows_the_per_sequence_bytes() -> None:
    free = kv_budget_bytes(GPT_OSS, H100)
    for ctx in (4096, 131072):
        seq = kv_bytes_per_sequence(GPT_OSS, ctx, block_size=16)
        assert max_concurrency(GPT_OSS, H100, ctx) == int(free // seq)
    llama = get_model("llama-3-8b")  # full attention: blocks // blocks per sequence
    blocks = int(kv_budget_bytes(llama, H100) // (131072 * 16))
    assert max_concurrency(llama, H100, 8192) == blocks // 512


def test_the_simulators_pool_prices_every_sliding_token() -> None:
    """Blocks leaving a sliding window are not freed yet: a token costs every layer."""
    scenario = validate_scenario({"model": {"config": "builtin:gpt-oss-20b"}}, "test")
    budget = kv_budget(scenario)
    assert budget.kv_bytes_per_token == 24 * 2 * 8 * 64 * 2
    scenario = validate_scenario({"model": dataclasses.asdict(hybrid()) | {
        "layer_types": list(hybrid().layer_types)}}, "test")
    plain = validate_scenario({"model": dataclasses.asdict(dataclasses.replace(
        hybrid(), layer_types=(), linear_state_elements=0))}, "test")
    # the linear layers' state for max_num_seqs sequences is set aside beside activations
    assert kv_budget(scenario).activation_reserve_bytes - kv_budget(
        plain).activation_reserve_bytes == pytest.approx(256 * linear_state_bytes(hybrid()))
