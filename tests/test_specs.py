"""Specs, catalogues and the capacity math: shapes in, hand-checkable numbers out."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.config.catalogue import (
    HARDWARE,
    MODELS,
    get_hardware,
    get_model,
    hardware_from_fields,
    model_from_fields,
)
from sim.config.costs import (
    activation_reserve_bytes,
    allreduce_time_s,
    decode_step_floor_s,
    flops_per_token,
    kv_budget_bytes,
    kv_bytes_per_token,
    max_concurrency,
    max_kv_tokens,
    memory_bound_crossover_batch,
    weights_bytes,
    weights_read_bytes,
)
from sim.config.specs import ModelSpec, RopeScaling, stored_as

H100 = get_hardware("h100-sxm")


@pytest.mark.parametrize(("name", "total", "active"), [
    ("llama-3-8b", 8.03e9, 8.03e9),
    ("llama-3-70b", 70.6e9, 70.6e9),
    ("llama-3.1-405b", 405.9e9, 405.9e9),
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("qwen2.5-1.5b", 1.54e9, 1.54e9),  # tied embeddings, qkv bias
    ("qwen2.5-7b", 7.61e9, 7.61e9),
    ("qwen2.5-72b", 72.7e9, 72.7e9),
    ("mistral-7b", 7.25e9, 7.25e9),
])
def test_param_counts_match_published(name: str, total: float, active: float) -> None:
    model = get_model(name)
    assert model.total_params == pytest.approx(total, rel=0.01)
    assert model.active_params == pytest.approx(active, rel=0.01)


def test_tied_embeddings_drop_one_vocab_table() -> None:
    untied = get_model("qwen2.5-1.5b")
    tied = dataclasses.replace(untied, tie_embeddings=False)
    assert tied.total_params - untied.total_params == untied.vocab_size * untied.hidden_size


def test_catalogue_is_consistent_and_read_only() -> None:
    for key, model in MODELS.items():
        assert model.name == key == key.lower()
        assert model.num_heads * model.head_dim == model.hidden_size
    for key, hw in HARDWARE.items():
        assert hw.name == key
        # dense bf16 FLOPs per HBM byte (H20's export-capped compute: 37)
        assert 30 < hw.ridge_flops_per_byte < 1000
    with pytest.raises(TypeError):
        MODELS["new"] = MODELS["tiny"]  # type: ignore[index]


def test_llama3_kv_bytes_per_token_by_hand() -> None:
    model = get_model("llama-3-8b")
    assert kv_bytes_per_token(model) == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(stored_as(model, "fp8"), tp=2) == 2 * 32 * 4 * 128 * 1


def test_kv_heads_replicate_past_tp() -> None:
    model = get_model("llama-3-70b")  # 8 KV heads
    assert kv_bytes_per_token(model, tp=16) == kv_bytes_per_token(model, tp=8)
    assert kv_bytes_per_token(model, tp=8) == kv_bytes_per_token(model, tp=1) / 8


@given(st.sampled_from(sorted(MODELS)), st.sampled_from([("fp8", 1), ("bf16", 2), ("fp32", 4)]))
def test_kv_and_weights_scale_linearly_with_dtype(name: str, dtype: tuple[str, float]) -> None:
    model, (dtype_name, size) = MODELS[name], dtype
    one = stored_as(model, "fp8")
    assert kv_bytes_per_token(stored_as(model, dtype_name)) == pytest.approx(
        kv_bytes_per_token(one) * size)
    # embeddings and norms stay bf16 under fp8 weights: compare fp32 with bf16 instead
    if dtype_name == "fp32":
        assert weights_bytes(stored_as(model, "fp32")) == pytest.approx(
            2 * weights_bytes(model))


@given(st.sampled_from(sorted(MODELS)), st.sampled_from([1, 2, 4, 8]))
def test_tp_divides_weights_up_to_replicated_norms(name: str, tp: int) -> None:
    model = MODELS[name]
    if model.num_heads % tp or tp > model.num_kv_heads:
        return
    h = model.hidden_size
    router = h * model.num_experts if model.num_experts > 1 else 0
    replicated_bytes = (model.num_layers * (2 * h + router) + h) * 2  # norms and router
    sharded = weights_bytes(model, tp=tp) * tp
    assert sharded - weights_bytes(model) == pytest.approx((tp - 1) * replicated_bytes)


def test_bad_tp_and_bad_shapes_name_the_field() -> None:
    with pytest.raises(ValueError, match="tp=3"):
        weights_bytes(get_model("llama-3-8b"), tp=3)
    tiny = get_model("tiny")
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        dataclasses.replace(tiny, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_layers must be a positive integer, got 0"):
        dataclasses.replace(tiny, num_layers=0)
    with pytest.raises(ValueError, match="experts_per_token=2"):
        dataclasses.replace(tiny, experts_per_token=2)
    with pytest.raises(ValueError, match="memory_bandwidth_bytes_per_s"):
        dataclasses.replace(H100, memory_bandwidth_bytes_per_s=-1.0)


def test_lookup_is_case_insensitive_and_lists_known_names() -> None:
    assert get_model("Llama-3-8B") is MODELS["llama-3-8b"]
    assert get_hardware(" H200 ") is HARDWARE["h200"]
    with pytest.raises(ValueError, match=r"unknown model 'llama-9b'; known: llama-3-8b, "):
        get_model("llama-9b")
    with pytest.raises(ValueError, match="h100-sxm"):
        get_hardware("tpu")


def test_model_from_fields_with_base_coerces_strings() -> None:
    model = model_from_fields({"base": "llama-3-8b", "num_layers": "40", "tie_embeddings": "yes",
                               "rope_scaling": {"factor": 8, "low_freq_factor": 1,
                                                "high_freq_factor": 4,
                                                "original_max_context_tokens": 8192}})
    base = MODELS["llama-3-8b"]
    assert model.num_layers == 40 and model.tie_embeddings
    assert model.hidden_size == base.hidden_size and model.name != base.name
    assert isinstance(model.rope_scaling, RopeScaling)
    assert model.total_params > base.total_params - base.vocab_size * base.hidden_size


def test_from_fields_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="'layers'"):
        model_from_fields({"base": "tiny", "layers": 4})
    with pytest.raises(ValueError, match="missing field.*num_layers"):
        model_from_fields({"name": "x", "hidden_size": 64})
    with pytest.raises(ValueError, match="num_heads='many'"):
        model_from_fields({"base": "tiny", "num_heads": "many"})
    with pytest.raises(ValueError, match="num_layers=2.5"):
        model_from_fields({"base": "tiny", "num_layers": 2.5})
    hw = hardware_from_fields({"base": "h100-sxm", "memory_bytes": 96e9})
    assert hw.memory_bytes == 96e9 and hw.bf16_flops_per_s == H100.bf16_flops_per_s
    with pytest.raises(ValueError, match="unknown hardware"):
        hardware_from_fields({"base": "nope"})


def test_flops_per_token_is_twice_active_matmuls_plus_linear_attention() -> None:
    model = get_model("mixtral-8x7b")
    embedding = model.vocab_size * model.hidden_size
    assert flops_per_token(model, 0) == pytest.approx(2 * (model.active_params - embedding),
                                                      rel=1e-3)
    step = flops_per_token(model, 2000) - flops_per_token(model, 1000)
    assert flops_per_token(model, 3000) - flops_per_token(model, 2000) == pytest.approx(step)
    assert step == pytest.approx(1000 * 4 * model.num_layers * model.num_heads * model.head_dim)


def test_moe_reads_only_touched_experts() -> None:
    model = get_model("mixtral-8x7b")
    one, many = weights_read_bytes(model, 1), weights_read_bytes(model, 64)
    assert one < 0.35 * many
    # 4 tokens x top-2 of 8 touch 8 (1 - (6/8)^4) = 5.47 experts in expectation, not 8
    expert = 32 * 3 * 4096 * 14336 * 2
    assert weights_read_bytes(model, 4) == pytest.approx(
        one + (8 * (1 - 0.75**4) - 2) * expert)
    assert many < weights_bytes(model)  # the embedding table is gathered, not streamed


def test_activation_reserve_is_modest_and_grows_with_the_budget() -> None:
    model = get_model("llama-3-8b")
    base = activation_reserve_bytes(model, 8192, 256)
    assert base < 0.15 * weights_bytes(model)
    assert activation_reserve_bytes(model, 16384, 256) > base
    assert activation_reserve_bytes(model, 8192, 512) > base


def test_kv_budget_is_memory_minus_weights_minus_activations() -> None:
    model = get_model("llama-3-8b")
    reserve = 1e9
    expected = 0.9 * H100.memory_bytes - weights_bytes(model) - reserve
    assert kv_budget_bytes(model, H100, 1, 0.9, reserve) == pytest.approx(expected)
    assert kv_budget_bytes(get_model("llama-3.1-405b"), H100) == 0.0
    assert max_concurrency(get_model("llama-3.1-405b"), H100, 1024) == 0
    with pytest.raises(ValueError, match="memory_utilization"):
        kv_budget_bytes(model, H100, memory_utilization=1.5)


@given(st.integers(1, 200_000), st.sampled_from([1, 16, 32]))
def test_concurrency_is_block_rounded_and_monotone(context: int, block_size: int) -> None:
    model = get_model("llama-3-8b")
    tokens = max_kv_tokens(model, H100, block_size=block_size)
    assert tokens % block_size == 0
    seqs = max_concurrency(model, H100, context, block_size=block_size)
    per_seq = math.ceil(context / block_size) * block_size
    assert seqs * per_seq <= tokens < (seqs + 1) * per_seq
    assert max_concurrency(model, H100, context + block_size, block_size=block_size) <= seqs


def test_allreduce_is_a_ring() -> None:
    assert allreduce_time_s(1e9, 1, H100) == 0.0
    assert allreduce_time_s(1e9, 8, H100) == pytest.approx(
        2 * 7 / 8 * 1e9 / H100.interconnect_bandwidth_bytes_per_s)
    assert allreduce_time_s(1e9, 8, H100) > allreduce_time_s(1e9, 2, H100)


def test_decode_floor_reads_weights_once_and_kv_per_sequence() -> None:
    model = get_model("llama-3-8b")
    bw = H100.memory_bandwidth_bytes_per_s
    assert decode_step_floor_s(model, H100, 1, 0) == pytest.approx(
        weights_read_bytes(model, 1) / bw)
    extra = decode_step_floor_s(model, H100, 4, 1000) - decode_step_floor_s(model, H100, 4, 0)
    assert extra == pytest.approx(4 * 1000 * 131072 / bw)


@pytest.mark.parametrize(("name", "context", "tp"), [
    ("llama-3-8b", 0, 1), ("llama-3-8b", 128, 1), ("llama-3-70b", 1024, 8),
    ("mixtral-8x7b", 0, 1), ("mixtral-8x7b", 512, 2), ("qwen2.5-72b", 256, 4),
])
def test_crossover_balances_compute_and_memory(name: str, context: int, tp: int) -> None:
    model = get_model(name)
    batch = memory_bound_crossover_batch(model, H100, context, tp)
    assert 1 < batch < math.inf
    compute_s = batch * flops_per_token(model, context, tp) / H100.bf16_flops_per_s
    memory_s = decode_step_floor_s(model, H100, batch, context, tp)  # type: ignore[arg-type]
    assert compute_s == pytest.approx(memory_s, rel=1e-9)


def test_crossover_never_when_kv_reads_outrun_compute() -> None:
    model = get_model("llama-3-8b")
    assert memory_bound_crossover_batch(model, H100, 8192) == math.inf
    assert memory_bound_crossover_batch(model, H100, 0) == pytest.approx(
        H100.ridge_flops_per_byte, rel=0.1)  # 2 flops and 2 bytes per weight


def test_model_spec_is_a_frozen_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODELS["tiny"].num_layers = 3  # type: ignore[misc]
    assert isinstance(MODELS["tiny"], ModelSpec)
