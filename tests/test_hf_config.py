"""Hugging Face config.json files read into ModelSpecs: the shipped ones against their
model cards' parameter counts, the quantisation configs, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from sim.config.attention import layer_counts
from sim.config.hf_config import MODELS_DIR, read_hf_config, spec_from_config
from sim.config.hf_quant import HFConfigError
from sim.config.loader import load_scenario

# (total, active) billions as the model cards state them; active counts the embedding
# once where the card does
PUBLISHED = {
    "llama-3.1-8b": (8.03, None), "qwen2.5-7b": (7.62, None), "qwen3-8b": (8.19, None),
    "qwen3-30b-a3b": (30.5, 3.3), "mistral-7b-v0.3": (7.25, None), "mixtral-8x7b": (46.7, 12.9),
    "gpt-oss-120b": (116.8, None), "gpt-oss-20b": (20.9, None), "gemma-2-9b": (9.24, None),
    "gemma-3-27b": (27.0, None), "deepseek-v3": (671.0, 37.0), "phi-3-mini-4k": (3.82, None),
    "phi-4": (14.7, None), "llama-2-7b": (6.74, None), "llama-2-70b": (68.98, None),
    "codellama-34b-instruct": (33.74, None),
}


def test_every_shipped_config_reads() -> None:
    names = sorted(p.name for p in MODELS_DIR.iterdir() if p.is_dir())
    assert len(names) >= 17 and set(PUBLISHED) <= set(names)
    for name in names:
        assert read_hf_config(MODELS_DIR / name).spec.name == name


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_model_cards(name: str) -> None:
    spec = read_hf_config(f"builtin:{name}").spec
    total, active = PUBLISHED[name]
    assert spec.total_params / 1e9 == pytest.approx(total, rel=0.01)
    if active is not None:
        assert spec.active_params / 1e9 == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize(("name", "full", "sliding", "window"), [
    ("gpt-oss-120b", 18, 18, 128), ("gemma-2-9b", 21, 21, 4096),
    ("gemma-3-27b", 10, 52, 1024),  # every 6th layer global
    ("mistral-7b-v0.1", 0, 32, 4096), ("phi-3-mini-4k", 0, 32, 2047),
    ("mistral-7b-v0.3", 32, 0, 0), ("qwen2.5-7b", 28, 0, 0),  # use_sliding_window false
])
def test_which_layers_slide(name: str, full: int, sliding: int, window: int) -> None:
    spec = read_hf_config(f"builtin:{name}").spec
    assert layer_counts(spec) == {"full": full, "sliding": sliding, "linear": 0}
    assert spec.sliding_window == window


@pytest.mark.parametrize(("name", "weights", "experts"), [
    ("deepseek-v3", "fp8-block", "fp8-block"), ("qwen3-8b-fp8", "fp8-block", "fp8-block"),
    ("llama-3.1-70b-awq-int4", "int4-g128", "int4-g128"),
    ("qwen2.5-7b-gptq-int4", "int4-g128", "int4-g128"),
    ("gpt-oss-120b", "bf16", "mxfp4"),  # attention kept bf16 (modules_to_not_convert)
    ("llama-3.1-8b", "bf16", "bf16"),
])
def test_quantization_config_sets_the_weight_dtypes(name: str, weights: str,
                                                    experts: str) -> None:
    spec = read_hf_config(f"builtin:{name}").spec
    assert (spec.weights.name, spec.experts.name) == (weights, experts)


def _raw(name: str) -> dict:
    return json.loads((MODELS_DIR / name / "config.json").read_text())


def test_deepseek_v3_reads_mla_and_shared_experts() -> None:
    spec = read_hf_config("builtin:deepseek-v3").spec
    assert (spec.attention, spec.kv_lora_rank, spec.qk_rope_head_dim) == ("mla", 512, 64)
    assert (spec.num_experts, spec.experts_per_token, spec.num_shared_experts) == (256, 8, 1)
    assert (spec.first_dense_layers, spec.moe_intermediate_size) == (3, 2048)


def test_compressed_tensors_and_gptq_per_channel() -> None:
    raw = _raw("llama-3.1-8b") | {"quantization_config": {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}}
    assert spec_from_config(raw, "x").spec.weight_dtype == "fp8"
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": -1}
    assert spec_from_config(raw, "x").spec.weight_dtype == "int4-g4096"


@pytest.mark.parametrize(("change", "needle"), [
    ({"num_hidden_layers": None}, "field num_hidden_layers: missing; servesim needs it"),
    ({"vocab_size": None}, "field vocab_size: missing"),
    ({"hidden_size": "big"}, "field hidden_size: 'big'; must be a positive integer"),
    ({"model_type": "rwkv"}, "field model_type: 'rwkv' is not modelled; allowed: llama"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}},
     "quantization_config.quant_method: 'bitsandbytes' is not modelled"),
    ({"layer_types": ["full_attention"] * 3}, "field layer_types: must list 32 layers"),
])
def test_a_config_servesim_cannot_read_exits_2_naming_the_field(
        change: dict, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = {k: v for k, v in (_raw("llama-3.1-8b") | change).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert main(["capacity", "--config", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and needle in err


def test_unmodelled_fields_are_named_in_one_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--config", "builtin:gemma-2-9b", "--json"]) == 0
    err = capsys.readouterr().err
    assert ("note: fields servesim does not model: attn_logit_softcapping, "
            "final_logit_softcapping, query_pre_attn_scalar") in err


def test_scenario_reads_a_config_beside_it(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(_raw("qwen3-8b")))
    (tmp_path / "s.yaml").write_text("model: {config: m, kv_dtype: fp8}\n")
    scenario, _ = load_scenario(tmp_path / "s.yaml")
    spec = scenario.model_spec
    assert (spec.num_layers, spec.qk_norm, spec.kv_dtype) == (36, True, "fp8")


def test_config_and_model_flags_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--config", "builtin:phi-4", "--model", "llama-3-8b"]) == 2
    assert "give one of --config, --model" in capsys.readouterr().err


def test_bad_shape_in_a_config_is_an_error_not_a_traceback() -> None:
    raw = _raw("llama-3.1-8b") | {"num_key_value_heads": 7}
    with pytest.raises(HFConfigError, match="num_kv_heads=7 must divide"):
        spec_from_config(raw, "x")


def test_servesim_run_names_what_a_config_leaves_out(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text(
        "model: {config: builtin:gpt-oss-20b}\n"
        "workload: {arrivals: {process: poisson, rate: 4}, num_requests: 8,\n"
        "           prompt_tokens: {dist: fixed, value: 512},\n"
        "           output_tokens: {dist: fixed, value: 16}}\n")
    assert main(["run", str(tmp_path / "s.yaml"), "--no-plots", "--quiet",
                 "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "note: model: fields servesim does not model: swiglu_limit" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["completed"] == 8 and summary["total_output_tokens"] == 8 * 16
