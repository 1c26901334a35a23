"""The parts of a config.json that differ by family: MLA, which layers slide, MoE.

Each reads the Hugging Face config class's own rule (Gemma-2 slides on even layers,
Gemma-3 on all but every sliding_window_pattern-th, Qwen2/3 only with
use_sliding_window, gpt-oss and newer configs list layer_types) and refuses a layout it
does not model rather than approximating it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sim.config.checks import MAX_DIMENSION, shown
from sim.config.hf_quant import HFConfigError

_LAYER_KINDS = {"full_attention": "full", "sliding_attention": "sliding"}


class ConfigFields:
    """A config's fields (class defaults applied): required ones checked, optional ones
    defaulted."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = dict(raw)

    def need(self, key: str, why: str, most: int = MAX_DIMENSION) -> int:
        """A required positive integer, at most `most` (a bound stated in the message)."""
        value = self.raw.get(key)
        if value is None:
            raise HFConfigError(f"field {key}: missing; servesim needs it for {why}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise HFConfigError(f"field {key}: {shown(value)}; must be a positive integer "
                                f"({why})")
        if value > most:
            raise HFConfigError(f"field {key}: {shown(value)}; must be at most {most:,} ({why})")
        return value

    def get(self, key: str, default: Any) -> Any:
        value = self.raw.get(key)
        return default if value is None else value


def attention_fields(f: ConfigFields, family: str) -> dict[str, Any]:
    """MLA's ranks and head widths (DeepSeek-V3); nothing for GQA families."""
    if family != "deepseek_v3":
        return {}
    nope = f.need("qk_nope_head_dim", "MLA's query/key width")
    rope = f.need("qk_rope_head_dim", "MLA's cached rope key")
    return {"attention": "mla", "q_lora_rank": int(f.get("q_lora_rank", 0)),
            "kv_lora_rank": f.need("kv_lora_rank", "MLA's cached latent"),
            "qk_rope_head_dim": rope, "qk_nope_head_dim": nope,
            "v_head_dim": f.need("v_head_dim", "MLA's value width"), "head_dim": nope + rope}


def _listed(f: ConfigFields, layers: int) -> tuple[str, ...]:
    listed = f.raw["layer_types"]
    if not isinstance(listed, list) or len(listed) != layers:
        raise HFConfigError(f"field layer_types: must list {layers} layers, got {listed!r}")
    unknown = sorted({k for k in listed if k not in _LAYER_KINDS})
    if unknown:
        raise HFConfigError(f"field layer_types: {', '.join(map(str, unknown))} not modelled; "
                            f"allowed: {', '.join(_LAYER_KINDS)}")
    return tuple(_LAYER_KINDS[k] for k in listed)


def _pattern(f: ConfigFields, family: str, layers: int) -> tuple[str, ...]:
    """Which layers slide when the config gives no layer_types list."""
    window = f.raw.get("sliding_window")
    if family == "gemma2":
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(layers))
    if family in ("gemma3", "gemma3_text"):
        every = f.need("sliding_window_pattern", "which Gemma-3 layers are global")
        return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(layers))
    if family in ("qwen2", "qwen3", "qwen3_moe"):
        if not f.get("use_sliding_window", False):
            return ()
        first = int(f.get("max_window_layers", layers))
        return tuple("sliding" if i >= first else "full" for i in range(layers))
    if window is not None:  # Mistral v0.1, Phi-3: every layer slides
        return ("sliding",) * layers
    return ()


def layer_fields(f: ConfigFields, family: str, layers: int) -> dict[str, Any]:
    """layer_types and sliding_window; a window as long as the context slides nothing."""
    kinds = _listed(f, layers) if f.raw.get("layer_types") is not None else \
        _pattern(f, family, layers)
    if "sliding" not in kinds:
        return {}
    window = f.need("sliding_window", "the sliding layers' KV")
    if window >= f.get("max_position_embeddings", 0):
        return {}
    return {"layer_types": kinds, "sliding_window": window}


def moe_fields(f: ConfigFields, family: str) -> dict[str, Any]:
    """Routed experts, top-k, the expert width, shared experts and leading dense layers."""
    if family == "mixtral" or family == "gpt_oss":
        experts = f.need("num_local_experts", "the experts' weights")
        top_k = f.raw.get("num_experts_per_tok", f.raw.get("experts_per_token"))
        if top_k is None:
            raise HFConfigError("field num_experts_per_tok: missing; servesim needs it for "
                                "the experts each token reads")
        return {"num_experts": experts, "experts_per_token": int(top_k)}
    if family == "qwen3_moe":
        if f.get("decoder_sparse_step", 1) != 1 or f.get("mlp_only_layers", []):
            raise HFConfigError("fields decoder_sparse_step/mlp_only_layers: dense layers "
                                "between MoE layers are not modelled; allowed: step 1, none")
        return {"num_experts": f.need("num_experts", "the experts' weights"),
                "experts_per_token": f.need("num_experts_per_tok", "the experts each token "
                                            "reads"),
                "moe_intermediate_size": f.need("moe_intermediate_size", "an expert's width")}
    if family == "deepseek_v3":
        if f.get("moe_layer_freq", 1) != 1:
            raise HFConfigError(f"field moe_layer_freq: {f.raw['moe_layer_freq']!r} not "
                                "modelled; allowed: 1")
        return {"num_experts": f.need("n_routed_experts", "the experts' weights"),
                "experts_per_token": f.need("num_experts_per_tok", "the experts each token "
                                            "reads"),
                "moe_intermediate_size": f.need("moe_intermediate_size", "an expert's width"),
                "num_shared_experts": int(f.get("n_shared_experts", 0)),
                "first_dense_layers": int(f.get("first_k_dense_replace", 0))}
    return {}
