"""Number formats as values: the bytes an element costs in memory, scales included, and the
tensor-core rate its matmuls run at.

Why scales are counted: a quantised checkpoint stores a scale (and for AWQ/GPTQ a zero
point) per group of elements, and at 4 bits that adds 4-12% to the bytes streamed per
step. Why a compute kind: fp8 weights with fp8 activations run on fp8 tensor cores (twice
bf16's rate on Hopper), while weight-only int4 (AWQ/GPTQ, W4A16) is dequantised to bf16
before the matmul, so it saves bytes but no FLOP time. A GPU without a tensor-core rate for
a kind runs it at bf16's (sim.config.hardware.HardwareSpec.flops_per_s).
"""

from __future__ import annotations

import re
from typing import NamedTuple

COMPUTE_KINDS = ("bf16", "fp8", "int8", "fp4")


class DType(NamedTuple):
    """`bits` per element plus `scale_bits` per `group_size` elements (0: no per-group scale).

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    name: str
    bits: int
    compute: str  # which tensor-core rate a matmul over these weights runs at
    scale_bits: int = 0
    group_size: int = 0
    description: str = ""

    @property
    def bytes_per_element(self) -> float:
        per_group = self.scale_bits / self.group_size if self.group_size else 0.0
        return (self.bits + per_group) / 8

    @property
    def quantised(self) -> bool:
        """Stored in fewer than 16 bits: embeddings and norms then stay in bf16, as
        quantised checkpoints (fp8, AWQ, GPTQ, MXFP4) keep them."""
        return self.bits < 16


_FIXED = {
    "fp32": DType("fp32", 32, "bf16", description="float32 (the engine on a CPU)"),
    "bf16": DType("bf16", 16, "bf16", description="bfloat16"),
    "fp16": DType("fp16", 16, "bf16", description="float16"),
    "fp8": DType("fp8", 8, "fp8", description="fp8 e4m3, per-tensor scale (vLLM's fp8 KV "
                 "cache, per-tensor fp8 checkpoints)"),
    "fp8-block": DType("fp8-block", 8, "fp8", 32, 128 * 128,
                       description="fp8 e4m3 with an fp32 scale per 128x128 block "
                       "(DeepSeek-V3's weight_block_size)"),
    "int8": DType("int8", 8, "int8", description="int8 weights and activations (W8A8), "
                  "per-channel scales"),
    "mxfp4": DType("mxfp4", 4, "fp4", 8, 32, description="OCP microscaling fp4 (e2m1) with "
                   "an 8-bit power-of-two scale per 32 elements (gpt-oss's experts)"),
    "nvfp4": DType("nvfp4", 4, "fp4", 8, 16, description="NVIDIA fp4 (e2m1) with an fp8 "
                   "e4m3 scale per 16 elements"),
}
# int4-g128 / int8-g64: AWQ/GPTQ weight-only, an fp16 scale and an N-bit zero per group
_GROUPED = re.compile(r"int(4|8)-g(\d+)")
DTYPE_NAMES = (*_FIXED, "int4 (= int4-g128)", "int4-gN", "int8-gN")


def grouped_int(bits: int, group_size: int) -> DType:
    """AWQ/GPTQ weight-only integers: dequantised to bf16 before the matmul."""
    if bits not in (4, 8) or group_size < 1:
        raise ValueError(f"grouped integers are int4 or int8 with a positive group size, got "
                         f"int{bits} groups of {group_size}")
    return DType(f"int{bits}-g{group_size}", bits, "bf16", 16 + bits, group_size,
                 description=f"int{bits} weight-only, an fp16 scale and an int{bits} zero "
                 f"per {group_size} elements (AWQ/GPTQ)")


def get_dtype(name: str) -> DType:
    """A dtype by name; ValueError naming the choices when unknown."""
    key = str(name).strip().lower()
    if key == "int4":
        key = "int4-g128"
    if key in _FIXED:
        return _FIXED[key]
    grouped = _GROUPED.fullmatch(key)
    if grouped and int(grouped.group(2)) > 0:
        return grouped_int(int(grouped.group(1)), int(grouped.group(2)))
    raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_NAMES)}")


def dtype_bytes(name: str) -> float:
    return get_dtype(name).bytes_per_element


def carrier_dtype(weights: DType) -> DType:
    """The dtype of what a quantised checkpoint leaves unquantised (embeddings, lm_head,
    norms, routers) and of activations: bf16, or the weights' own 16/32-bit float."""
    return get_dtype("bf16") if weights.quantised else weights
