"""A model's weights: random of the real shapes, or a Hugging Face checkpoint
(config.json <-> ModelSpec, safetensors <-> LlamaModel); `build_model` makes either.

The engine fuses q/k/v and gate/up; here each HF tensor is mapped to its row
range of the fused parameter, so loading copies straight into place (no
second copy of the model) and saving splits them back out. Llama and Qwen2
names are the same; Qwen2 adds q/k/v biases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gpu_engine.model import LlamaModel
from gpu_engine.moe import MoE
from sim.config.specs import ModelSpec, RopeScaling

_INDEX_FILE = "model.safetensors.index.json"
_SINGLE_FILE = "model.safetensors"


def hf_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """HF name -> the view of the engine parameter that holds it."""
    spec = model.spec
    q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    inter = spec.intermediate_size
    out = {"model.embed_tokens.weight": model.embed_tokens.weight,
           "model.norm.weight": model.norm.weight}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        prefix = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        qkv_rows = {"q_proj": (0, q_dim), "k_proj": (q_dim, q_dim + kv_dim),
                    "v_proj": (q_dim + kv_dim, q_dim + 2 * kv_dim)}
        for name, (lo, hi) in qkv_rows.items():
            out[f"{prefix}self_attn.{name}.weight"] = attn.qkv_proj.weight[lo:hi]
            if attn.qkv_proj.bias is not None:
                out[f"{prefix}self_attn.{name}.bias"] = attn.qkv_proj.bias[lo:hi]
        out[f"{prefix}self_attn.o_proj.weight"] = attn.o_proj.weight
        if attn.q_norm is not None and attn.k_norm is not None:
            out[f"{prefix}self_attn.q_norm.weight"] = attn.q_norm.weight
            out[f"{prefix}self_attn.k_norm.weight"] = attn.k_norm.weight
        if isinstance(mlp, MoE):  # Qwen3-MoE checkpoint names, one tensor per expert
            out[f"{prefix}mlp.gate.weight"] = mlp.gate.weight
            width = mlp.inter
            for e in range(spec.num_experts):
                expert = f"{prefix}mlp.experts.{e}."
                out[f"{expert}gate_proj.weight"] = mlp.gate_up_proj[e, :width]
                out[f"{expert}up_proj.weight"] = mlp.gate_up_proj[e, width:]
                out[f"{expert}down_proj.weight"] = mlp.down_proj[e]
        else:
            out[f"{prefix}mlp.gate_proj.weight"] = mlp.gate_up_proj.weight[:inter]
            out[f"{prefix}mlp.up_proj.weight"] = mlp.gate_up_proj.weight[inter:]
            out[f"{prefix}mlp.down_proj.weight"] = mlp.down_proj.weight
        out[f"{prefix}input_layernorm.weight"] = layer.input_layernorm.weight
        out[f"{prefix}post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
    return out


def hf_model_type(spec: ModelSpec) -> str:
    """The Hugging Face family a spec is saved as: qwen3(_moe) for q/k norms, MoE or
    sliding layers, qwen2 for q/k/v biases, llama otherwise."""
    if spec.is_moe:
        return "qwen3_moe"
    if spec.qk_norm or spec.sliding_window:
        return "qwen3"
    return "qwen2" if spec.qkv_bias else "llama"


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def _hf_config(spec: ModelSpec, dtype: torch.dtype) -> dict[str, Any]:
    family = hf_model_type(spec)
    if family.startswith("qwen3") and not spec.qk_norm:
        raise ValueError(f"model {spec.name!r}: MoE and sliding-window specs are saved as "
                         "Qwen3, whose attention has q/k norms; set qk_norm: true")
    qwen = family == "qwen2"
    config: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[family]],
        "model_type": family,
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size, "max_position_embeddings": spec.max_context_tokens,
        "rms_norm_eps": spec.rms_norm_eps, "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tie_embeddings, "hidden_act": "silu",
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if qwen:
        config["use_sliding_window"] = False
    else:
        config["attention_bias"] = False
    if family.startswith("qwen3"):
        config["layer_types"] = [f"{kind}_attention" for kind in spec.layer_kinds]
        config["use_sliding_window"] = bool(spec.sliding_window)
        config["sliding_window"] = spec.sliding_window or None
    if spec.is_moe:
        config.update(num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                      moe_intermediate_size=spec.expert_intermediate_size,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    scaling = spec.rope_scaling
    if scaling is not None:
        config["rope_scaling"] = {
            "rope_type": scaling.rope_type, "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_context_tokens}
    return config


def save_hf(model: LlamaModel, spec: ModelSpec, out_dir: Path) -> None:
    """config.json + model.safetensors under HF Llama (or Qwen2, with q/k/v biases) names."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = model.embed_tokens.weight.dtype
    (out_dir / "config.json").write_text(json.dumps(_hf_config(spec, dtype), indent=2) + "\n")
    tensors = {name: t.detach().to("cpu").contiguous().clone()
               for name, t in hf_tensors(model).items()}
    save_file(tensors, str(out_dir / _SINGLE_FILE), metadata={"format": "pt"})


def _weight_files(weights_dir: Path) -> list[Path]:
    index = weights_dir / _INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [weights_dir / name for name in sorted(set(weight_map.values()))]
    if (weights_dir / _SINGLE_FILE).is_file():
        return [weights_dir / _SINGLE_FILE]
    files = sorted(weights_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"weights_dir {str(weights_dir)!r}: no {_SINGLE_FILE}, {_INDEX_FILE} "
                         "or other *.safetensors file found")
    return files


@torch.no_grad()
def load_hf(model: LlamaModel, weights_dir: Path) -> None:
    """Copy an HF checkpoint (single or sharded safetensors) into `model` in place."""
    from safetensors import safe_open

    weights_dir = Path(weights_dir)
    targets = hf_tensors(model)
    device = model.embed_tokens.weight.device
    loaded: set[str] = set()
    for path in _weight_files(weights_dir):
        if not path.is_file():
            raise ValueError(f"weights_dir {str(weights_dir)!r}: shard {path.name!r} named in "
                             f"{_INDEX_FILE} is missing")
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                target = targets.get(name)
                if target is None:
                    continue  # e.g. rotary inv_freq buffers in old checkpoints
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(target.shape):
                    raise ValueError(f"{path.name}: tensor {name} has shape "
                                     f"{tuple(tensor.shape)}, the model needs "
                                     f"{tuple(target.shape)} (does config.json match?)")
                target.copy_(tensor)
                loaded.add(name)
    missing = [name for name in targets if name not in loaded]
    if missing:
        raise ValueError(f"weights_dir {str(weights_dir)!r} lacks {len(missing)} tensor(s) "
                         f"the model needs, e.g. {', '.join(missing[:3])}")


def _get(config: dict[str, Any], key: str, path: Path, default: Any = None) -> Any:
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"{path}: field {key} is missing; a Llama/Qwen2 config.json has it")
    return value


def _rope(config: dict[str, Any], path: Path) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from the classic (rope_scaling) or v5 (rope_parameters) layout."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)
    kind = params.get("rope_type", params.get("type"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise ValueError(f"{path}: rope_scaling.rope_type={kind!r} is not supported; "
                         "allowed: default, llama3")
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [f for f in fields if params.get(f) is None]
    if missing:
        raise ValueError(f"{path}: llama3 rope_scaling lacks {', '.join(missing)}")
    return theta, RopeScaling(
        factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_context_tokens=int(params["original_max_position_embeddings"]))


def spec_from_hf_config(path: Path) -> ModelSpec:
    """A ModelSpec from an HF config.json (or the directory holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"config {str(path)!r} not found; expected an HF config.json")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{path}: hidden_act={act!r} is not supported; allowed: silu")
    model_type = config.get("model_type", "llama")
    if model_type == "llama" and config.get("attention_bias"):
        raise ValueError(f"{path}: attention_bias=true is not supported for llama "
                         "(o_proj bias); allowed: false")
    heads = int(_get(config, "num_attention_heads", path))
    hidden = int(_get(config, "hidden_size", path))
    theta, scaling = _rope(config, path)
    return ModelSpec(
        name=path.parent.name or "hf-model",
        num_layers=int(_get(config, "num_hidden_layers", path)),
        hidden_size=hidden, num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(_get(config, "intermediate_size", path)),
        vocab_size=int(_get(config, "vocab_size", path)),
        max_context_tokens=int(_get(config, "max_position_embeddings", path)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        num_experts=int(config.get("num_local_experts") or config.get("num_experts") or 1),
        experts_per_token=int(config.get("num_experts_per_tok") or 1),
        rope_theta=theta, rope_scaling=scaling,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
    )


def build_model(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
                weights_dir: Path | None = None) -> LlamaModel:
    """Built on the meta device, materialised on `device`, then random or loaded weights.

    Nothing of the full model is ever allocated on the CPU when `device` is a GPU.
    """
    with torch.device("meta"):
        model = LlamaModel(spec)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.rotary.reset_buffers()
    if weights_dir is None:
        model.init_random(seed)
    else:
        load_hf(model, Path(weights_dir))
    model.eval().requires_grad_(False)
    return model
