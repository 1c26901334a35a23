"""A Hugging Face `quantization_config` read into servesim's weight dtypes.

Why apart from sim.config.hf_config: the quantisation formats (fp8 with or without
block scales, AWQ, GPTQ, MXFP4, compressed-tensors) are one concept, independent of
the architecture they are applied to. Each returns (weight_dtype, expert_dtype):
what the matmul weights and the routed experts are stored in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

QUANT_METHODS = ("fp8", "awq", "gptq", "mxfp4", "compressed-tensors")


class HFConfigError(ValueError):
    """A config.json servesim cannot turn into a model without guessing: exit code 2."""


def _grouped(method: str, quant: Mapping[str, Any], hidden_size: int) -> str:
    bits, group = quant.get("bits", 4), quant.get("group_size", 128)
    if bits not in (4, 8):
        raise HFConfigError(f"quantization_config.bits: {method} with {bits!r} bits is not "
                            "modelled; allowed: 4 or 8")
    if not isinstance(group, int) or group == 0 or group < -1:
        raise HFConfigError(f"quantization_config.group_size: {group!r}; allowed: a positive "
                            "group size, or -1 (one scale per channel)")
    # -1: one scale per output channel, i.e. a group as long as a row (hidden_size inputs)
    return f"int{bits}-g{hidden_size if group == -1 else group}"


def _fp8(quant: Mapping[str, Any]) -> str:
    block = quant.get("weight_block_size")
    if block is None:
        return "fp8"
    if list(block) != [128, 128]:
        raise HFConfigError(f"quantization_config.weight_block_size: {block!r} is not "
                            "modelled; allowed: [128, 128] (or none: per-tensor scales)")
    return "fp8-block"


def _compressed_tensors(quant: Mapping[str, Any]) -> str:
    groups = quant.get("config_groups") or {}
    schemes = [g.get("weights") or {} for g in groups.values() if isinstance(g, Mapping)]
    if len(schemes) != 1:
        raise HFConfigError("quantization_config.config_groups: compressed-tensors with "
                            f"{len(schemes)} weight schemes is not modelled; allowed: one")
    weights = schemes[0]
    bits, kind = weights.get("num_bits"), weights.get("type")
    if kind == "float" and bits == 8:
        return "fp8"
    if kind == "int" and bits in (4, 8):
        group = weights.get("group_size")
        if group:
            return f"int{bits}-g{group}"
        return "int8" if bits == 8 else "int4"
    raise HFConfigError(f"quantization_config.config_groups: {kind} weights of {bits} bits "
                        "are not modelled; allowed: float 8 (fp8), int 4 or 8")


def quantised_dtypes(quant: Mapping[str, Any], hidden_size: int,
                     is_moe: bool) -> tuple[str, str]:
    """(weight_dtype, expert_dtype) from `quantization_config`."""
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        name = _fp8(quant)
    elif method in ("awq", "gptq"):
        name = _grouped(method, quant, hidden_size)
    elif method == "compressed-tensors":
        name = _compressed_tensors(quant)
    elif method == "mxfp4":
        kept = " ".join(quant.get("modules_to_not_convert") or ())
        # gpt-oss: attention, router, embeddings and lm_head stay bf16; experts in MXFP4
        weights = "bf16" if "self_attn" in kept or not is_moe else "mxfp4"
        return weights, "mxfp4"
    else:
        raise HFConfigError(f"quantization_config.quant_method: {method!r} is not modelled; "
                            f"allowed: {', '.join(QUANT_METHODS)}")
    return name, name
