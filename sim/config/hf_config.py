"""A Hugging Face `config.json` read into a ModelSpec: the architectures served today.

Why here and not in the engine: capacity, scenarios and the roofline all need the
shape of the model someone is about to serve, and its config.json is where that shape
is published. Every field servesim needs is read or derived the way the model's
Hugging Face config class defines it (num_key_value_heads defaults to the attention
heads, head_dim to hidden_size / heads); a needed field that is missing is an error
(HFConfigError, exit code 2), never a guess. Fields that change what a model costs but
that servesim does not model are named in one note; metadata (token ids, dropout,
versions) is ignored silently. Shipped examples: sim/config/data/models/ (`builtin:NAME`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config.checks import MAX_LAYERS
from sim.config.hf_layers import ConfigFields, attention_fields, layer_fields, moe_fields
from sim.config.hf_quant import HFConfigError, quantised_dtypes
from sim.config.specs import ModelSpec, RopeScaling

BUILTIN_PREFIX = "builtin:"
# Published config.json files are a few kilobytes; a larger one is the wrong file.
MAX_CONFIG_BYTES = 4 * 2**20
MODELS_DIR = Path(__file__).parent / "data" / "models"
FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "gemma2",
            "gemma3", "gemma3_text", "deepseek_v3", "phi3")
# Hugging Face config-class defaults for fields their published config.json omits.
_CLASS_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "gemma2": {"tie_word_embeddings": True, "rms_norm_eps": 1e-6},
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072,
                    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                    "sliding_window_pattern": 6, "tie_word_embeddings": True},
}
# Read by this module (or shape-neutral, e.g. the activation of a gated MLP).
_READ = {"model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
         "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
         "max_position_embeddings", "tie_word_embeddings", "rope_theta", "rope_scaling",
         "rms_norm_eps", "attention_bias", "torch_dtype", "dtype", "quantization_config",
         "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
         "sliding_window_pattern", "num_local_experts", "num_experts", "num_experts_per_tok",
         "experts_per_token", "moe_intermediate_size", "decoder_sparse_step",
         "mlp_only_layers", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
         "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
         "qk_nope_head_dim", "v_head_dim", "hidden_act", "hidden_activation", "text_config",
         "architectures"}
# Metadata and training-only settings: they change nothing servesim computes.
_IGNORED = {"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version",
            "use_cache", "initializer_range", "attention_dropout", "hidden_dropout",
            "embd_pdrop", "resid_pdrop", "auto_map", "output_router_logits",
            "router_aux_loss_coef", "router_jitter_noise", "pretraining_tp", "mlp_bias",
            "cache_implementation", "original_max_position_embeddings", "initial_context_length",
            "unsloth_fixed", "ep_size", "aux_loss_alpha", "seq_aux", "norm_topk_prob",
            "use_qk_norm", "boi_token_index", "eoi_token_index", "image_token_index",
            "mm_tokens_per_image", "router_z_loss_coef", "tokenizer_class"}


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """The spec read from a config.json and the notes about what it leaves out."""

    spec: ModelSpec
    notes: tuple[str, ...]


def config_path(path: str | Path) -> Path:
    """The config.json for a file, a folder holding one, or `builtin:NAME` (shipped)."""
    text = str(path)
    if text.startswith(BUILTIN_PREFIX):
        name = text.removeprefix(BUILTIN_PREFIX)
        known = sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())
        if name not in known:
            raise HFConfigError(f"config {text!r}: no shipped config of that name; known: "
                                f"{', '.join(BUILTIN_PREFIX + k for k in known)}")
        return MODELS_DIR / name / "config.json"
    candidate = Path(text)
    if candidate.is_dir():
        candidate = candidate / "config.json"
    if not candidate.is_file():
        raise HFConfigError(f"config {text!r}: no such file (give a config.json, the folder "
                            f"holding it, or {BUILTIN_PREFIX}NAME)")
    return candidate


def read_hf_config(path: str | Path, name: str | None = None) -> LoadedConfig:
    """The ModelSpec of a config.json (see config_path), named after its folder."""
    from sim.config.yaml_input import read_text_bounded

    file = config_path(path)
    text = read_text_bounded(file, "config.json", MAX_CONFIG_BYTES, HFConfigError)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise HFConfigError(f"config {str(file)!r}: cannot read as JSON: {err}") from None
    except (ValueError, RecursionError):  # a 5,000-digit number, nesting thousands deep
        raise HFConfigError(f"config {str(file)!r}: cannot read as JSON: a number with "
                            "thousands of digits or nesting thousands deep") from None
    if not isinstance(raw, dict):
        raise HFConfigError(f"config {str(file)!r}: must hold a JSON object")
    try:
        folder = file.parent.name or file.absolute().parent.name  # "config.json" in the cwd
        return spec_from_config(raw, name or folder or "model")
    except HFConfigError as err:
        raise HFConfigError(f"config {str(file)!r}: {err}") from None


def _text_config(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Multimodal configs (Gemma-3) keep the decoder in text_config."""
    if not isinstance(raw.get("text_config"), Mapping):
        return dict(raw), []
    text = dict(raw["text_config"])
    for key in ("quantization_config", "torch_dtype", "tie_word_embeddings"):
        if key in raw and key not in text:
            text[key] = raw[key]
    return text, ["the vision tower (vision_config) is not modelled: text decoder only"]


def spec_from_config(raw: Mapping[str, Any], name: str) -> LoadedConfig:
    """A ModelSpec from config.json's fields (already parsed)."""
    fields, notes = _text_config(raw)
    family = str(fields.get("model_type", ""))
    if family not in FAMILIES:
        raise HFConfigError(f"field model_type: {family or 'missing'!r} is not modelled; "
                            f"allowed: {', '.join(FAMILIES)}")
    f = ConfigFields({**_CLASS_DEFAULTS.get(family, {}), **fields})
    layers = f.need("num_hidden_layers", "the layer count", MAX_LAYERS)
    hidden = f.need("hidden_size", "every weight matrix")
    heads = f.need("num_attention_heads", "attention")
    if f.raw.get("head_dim") is None and hidden % heads:
        notes.append(f"head_dim is not given and hidden_size {hidden} is not divisible by "
                     f"num_attention_heads {heads}: head_dim taken as {hidden // heads} "
                     f"(hidden_size / heads = {hidden / heads:.2f}); set head_dim if the "
                     "model's is another")
    values: dict[str, Any] = {
        "name": name, "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
        "num_kv_heads": f.get("num_key_value_heads", heads),
        "head_dim": f.get("head_dim", hidden // heads),
        "intermediate_size": f.need("intermediate_size", "the MLP's weights"),
        "vocab_size": f.need("vocab_size", "the embedding and lm_head"),
        "max_context_tokens": f.need("max_position_embeddings", "the longest request"),
        "tie_embeddings": bool(f.get("tie_word_embeddings", False)),
        "rope_theta": float(f.get("rope_theta", 10000.0)),
        "rms_norm_eps": float(f.get("rms_norm_eps", 1e-5)),
        "qkv_bias": family == "qwen2" or bool(f.get("attention_bias", False)),
        "qk_norm": family in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"),
    }
    values["rope_scaling"], rope_note = _rope(f.raw.get("rope_scaling"))
    notes += rope_note
    values.update(attention_fields(f, family))
    values.update(layer_fields(f, family, layers))
    values.update(moe_fields(f, family))
    values.update(_dtypes(f, hidden, values.get("num_experts", 1) > 1, notes))
    unmodelled = sorted(k for k in fields if k not in _READ and k not in _IGNORED)
    if unmodelled:
        notes.append(f"fields servesim does not model: {', '.join(unmodelled)}")
    try:
        spec = ModelSpec(**values)
    except ValueError as err:
        raise HFConfigError(str(err)) from None
    return LoadedConfig(spec, tuple(notes))


def _rope(scaling: Any) -> tuple[RopeScaling | None, list[str]]:
    if not isinstance(scaling, Mapping):
        return None, []
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        return RopeScaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                           float(scaling["high_freq_factor"]),
                           int(scaling["original_max_position_embeddings"])), []
    return None, [f"rope_scaling ({kind}) is not modelled: it changes no memory or FLOPs "
                  "(the engine would refuse it)"]


def _dtypes(f: ConfigFields, hidden: int, is_moe: bool, notes: list[str]) -> dict[str, str]:
    stored = str(f.get("torch_dtype", f.get("dtype", "bfloat16")))
    carrier = {"bfloat16": "bf16", "float16": "fp16"}.get(stored)
    if carrier is None:
        notes.append(f"torch_dtype {stored} is served as bf16, as vLLM does")
        carrier = "bf16"
    quant = f.raw.get("quantization_config")
    if not isinstance(quant, Mapping):
        return {"weight_dtype": carrier, "expert_dtype": "", "kv_dtype": carrier}
    weights, experts = quantised_dtypes(quant, hidden, is_moe)
    return {"weight_dtype": weights, "expert_dtype": "" if experts == weights else experts,
            "kv_dtype": carrier}
