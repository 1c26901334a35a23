"""The roofline's terms, each a small physical law, and their fitted constants per GPU family.

A step of a decoder runs, on each GPU, `num_layers` times: four GEMMs (fused
q/k/v, attention output, gate+up, down), a few small element-wise kernels
(two norms, rope, the activation, the residual add) and attention; then once
the lm_head GEMM over the sequences that emit a token, and sampling. The
host spends time around every step (scheduling, input preparation, output
processing), part of it per sequence. Each term here prices one of those:

- a GEMM of `rows` x k @ k x n reads its weights and activations from HBM
  and computes by waves of tiles: its rows padded up to whole tiles of
  `gemm_tile_rows`, its columns to tiles of `gemm_tile_cols`, and the GPU
  running `gemm_wave_tiles` (its SMs) of them at once. Its time is the soft
  maximum (t_mem^p + t_compute^p)^(1/p) of the two, plus a launch: the
  compute steps up at each new tile of rows (as measured kernels jump after
  256 and 512 rows), and with p finite the GEMM leaves the memory-bound
  regime before the ideal crossover; p and the tile shape are fitted;
- small kernels: a per-layer constant (their launches) plus their
  activation bytes at the GEMMs' bandwidth;
- attention per layer: the decodes' kernel and the prefill chunks' kernel,
  each a launch of its own plus max(FLOPs over its query-key pairs, KV
  bytes read), at attention's efficiencies, and never under a minimum;
- lm_head is a GEMM like any other; sampling reads and writes fp32 logits;
- CPU overhead: a per-step and a per-sequence term (serial with the GPU, as
  in vLLM's engine loop).

Prefill stays compute-bound and decode memory-bound because of the shapes:
a step reads each weight once however many rows it multiplies.

The constants come from `python -m calibrate.fit_roofline`, which fits them
per family on published kernel timings (calibration/measured/, Vidur,
LLMServingSim, inference-sim) and prints the held-out models' errors.
Every function is pure and works on floats and numpy arrays alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import ceil
from types import MappingProxyType
from typing import Any

import numpy as np

SAMPLING_BYTES_PER_LOGIT = 3 * 4  # fp32 logits written, read for softmax, probabilities read


@dataclass(frozen=True, slots=True)
class RooflineParams:
    """The fitted constants of one accelerator family (efficiencies are shares of datasheet)."""

    family: str
    bandwidth_efficiency: float  # a streaming GEMM weight read, share of datasheet HBM
    compute_efficiency: float  # a large GEMM, share of dense peak
    transition_sharpness: float  # p of the soft max between memory and compute time
    gemm_tile_rows: float  # a GEMM's rows are padded up to whole tiles of this height
    gemm_tile_cols: float  # ... and its columns to whole tiles of this width
    gemm_wave_tiles: float  # tiles the GPU runs at once (its SMs): compute goes by waves
    gemm_launch_s: float  # fixed cost of every GEMM kernel
    layer_small_s: float  # per layer: norms, rope, activation, residual add (launches)
    attention_bandwidth_efficiency: float
    attention_compute_efficiency: float
    decode_attention_launch_s: float  # per layer, the decodes' kernel
    prefill_attention_launch_s: float  # per layer, the prefill chunks' kernel
    attention_min_s: float  # no attention kernel takes less
    cpu_step_s: float  # host time per step
    cpu_seq_s: float  # host time per sequence in the step
    fitted_on: str  # where the numbers come from

    def __post_init__(self) -> None:
        for name in ("bandwidth_efficiency", "compute_efficiency",
                     "attention_bandwidth_efficiency", "attention_compute_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if not self.transition_sharpness >= 1:
            raise ValueError(f"transition_sharpness must be >= 1, "
                             f"got {self.transition_sharpness!r}")
        for name in ("gemm_tile_rows", "gemm_tile_cols", "gemm_wave_tiles"):
            value = getattr(self, name)
            if not (value > 0 and value < float("inf")):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        for name in ("gemm_launch_s", "layer_small_s", "decode_attention_launch_s",
                     "prefill_attention_launch_s", "attention_min_s",
                     "cpu_step_s", "cpu_seq_s"):
            value = getattr(self, name)
            if not (value >= 0 and value < float("inf")):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class LayerDims:
    """What sizes one GPU's kernels: every width already divided by tensor parallelism."""

    num_layers: int
    hidden: int
    q_dim: int  # query heads x head_dim on this GPU
    kv_dim: int  # KV heads x head_dim on this GPU (replicated when tp > KV heads)
    intermediate: float  # MLP width on this GPU
    mlp_in_matrices: int  # 2 for gate + up (SwiGLU), 1 for an ungated MLP
    vocab: float  # lm_head columns on this GPU

    @property
    def gemms(self) -> tuple[tuple[float, float], ...]:
        """(k, n) of the layer's four GEMMs: fused q/k/v, output, gate+up, down."""
        h = self.hidden
        return ((h, self.q_dim + 2 * self.kv_dim), (self.q_dim, h),
                (h, self.mlp_in_matrices * self.intermediate), (self.intermediate, h))

    @property
    def small_bytes_per_row(self) -> float:
        """Elements the small kernels move per token row: 2 norms (in, out), rope over q
        and k (read, write), the activation (reads gate and up, writes one), the residual
        add (two in, one out)."""
        h = self.hidden
        act = (self.mlp_in_matrices + 1) * self.intermediate
        return 4 * h + 2 * (self.q_dim + self.kv_dim) + act + 3 * h


def soft_max(a: Any, b: Any, p: float) -> Any:
    """(a^p + b^p)^(1/p): max(a, b) as p grows, a + b at p = 1; floats or numpy arrays."""
    if isinstance(a, float | int) and isinstance(b, float | int):
        hi = a if a >= b else b
        if hi <= 0:
            return 0.0
        return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)
    hi = np.maximum(a, b)
    safe = np.where(hi > 0, hi, 1.0)
    return hi * ((a / safe) ** p + (b / safe) ** p) ** (1.0 / p)


@dataclass(frozen=True, slots=True)
class GemmCost:
    """One GEMM's constants, derived once: time = launch + soft max(memory, compute).

    Compute goes by waves: the rows padded to whole tiles, times the column tiles, make
    the tiles; the GPU runs `wave_tiles` of them at once, each wave taking `wave_s`."""

    launch_s: float
    memory_s: float  # weights' read
    memory_s_per_row: float  # activations in and out
    tile_rows: float
    col_tiles: float  # tiles across the columns
    wave_tiles: float
    wave_s: float
    sharpness: float

    def __call__(self, rows: Any) -> Any:
        waves = np.ceil(np.ceil(rows / self.tile_rows) * self.col_tiles / self.wave_tiles)
        return self.launch_s + soft_max(self.memory_s + rows * self.memory_s_per_row,
                                        waves * self.wave_s, self.sharpness)

    def seconds(self, rows: float) -> float:
        """`self(rows)` for one float, in plain arithmetic: the simulator's hot path."""
        memory = self.memory_s + rows * self.memory_s_per_row
        compute = ceil(ceil(rows / self.tile_rows) * self.col_tiles / self.wave_tiles
                       ) * self.wave_s
        p = self.sharpness
        if memory >= compute:
            return self.launch_s + memory * (1.0 + (compute / memory) ** p) ** (1.0 / p)
        return self.launch_s + compute * (1.0 + (memory / compute) ** p) ** (1.0 / p)


def gemm_cost(k: float, n: float, flops_per_s: float, bytes_per_s: float,
              params: RooflineParams, weight_bytes: float = 2, act_bytes: float = 2,
              tile_scale: float = 1.0) -> GemmCost:
    """A k x n GEMM's constants: HBM at the bandwidth efficiency, FLOPs at the compute one.

    `weight_bytes` per stored weight element (a quantised dtype's, scales included) and
    `act_bytes` per activation element in and out; `flops_per_s` the rate its dtype's
    matmul runs at; `tile_scale` scales the fitted (bf16) tile height for another dtype
    (see sim.latency.roofline_layers.Gemm.tile_scale)."""
    bandwidth = bytes_per_s * params.bandwidth_efficiency
    tile_rows = params.gemm_tile_rows * tile_scale
    tile_cols = min(params.gemm_tile_cols, n)
    wave_flops = params.gemm_wave_tiles * tile_rows * tile_cols * 2.0 * k
    return GemmCost(params.gemm_launch_s, k * n * weight_bytes / bandwidth,
                    (k + n) * act_bytes / bandwidth, tile_rows, ceil(n / tile_cols),
                    params.gemm_wave_tiles, wave_flops / (flops_per_s * params.compute_efficiency),
                    params.transition_sharpness)


def gemm_s(rows: Any, k: float, n: float, flops_per_s: float, bytes_per_s: float,
           params: RooflineParams, dtype_bytes: float = 2) -> Any:
    """One GEMM over `rows` token rows: launch + soft max(HBM time, compute time)."""
    return gemm_cost(k, n, flops_per_s, bytes_per_s, params, dtype_bytes, dtype_bytes)(rows)


def layer_gemms_s(dims: LayerDims, rows: Any, flops_per_s: float, bytes_per_s: float,
                  params: RooflineParams, dtype_bytes: float = 2) -> Any:
    """One layer's four GEMMs."""
    return sum(gemm_s(rows, k, n, flops_per_s, bytes_per_s, params, dtype_bytes)
               for k, n in dims.gemms)


def small_kernels_s(dims: LayerDims, rows: Any, bytes_per_s: float, params: RooflineParams,
                    dtype_bytes: float = 2) -> Any:
    """One layer's norms, rope, activation and residual add."""
    return params.layer_small_s + rows * dims.small_bytes_per_row * dtype_bytes / (
        bytes_per_s * params.bandwidth_efficiency)


def _max(a: Any, b: Any) -> Any:
    if isinstance(a, float | int) and isinstance(b, float | int):
        return a if a >= b else b
    return np.maximum(a, b)


def _attention_s(pair_flops: Any, kv_bytes: Any, flops_per_s: float, bytes_per_s: float,
                 params: RooflineParams, launch_s: float) -> Any:
    work = _max(pair_flops / (flops_per_s * params.attention_compute_efficiency),
                kv_bytes / (bytes_per_s * params.attention_bandwidth_efficiency))
    return _max(params.attention_min_s, launch_s + work)


def decode_attention_s(pair_flops: Any, kv_bytes: Any, flops_per_s: float, bytes_per_s: float,
                       params: RooflineParams) -> Any:
    """One layer's decode attention kernel (the step's decodes together): at least
    attention_min_s, else its launch + max(FLOPs over its pairs, KV bytes read)."""
    return _attention_s(pair_flops, kv_bytes, flops_per_s, bytes_per_s, params,
                        params.decode_attention_launch_s)


def prefill_attention_s(pair_flops: Any, kv_bytes: Any, flops_per_s: float,
                        bytes_per_s: float, params: RooflineParams) -> Any:
    """One layer's prefill attention kernel (the step's chunks together), the same law with
    its own launch: a prefill kernel is a longer pipeline (query tiles, causal masking)."""
    return _attention_s(pair_flops, kv_bytes, flops_per_s, bytes_per_s, params,
                        params.prefill_attention_launch_s)


@dataclass(frozen=True, slots=True)
class AttentionCost:
    """One layer's attention kernel of one kind (decode or prefill) on one model, derived
    once: the law of decode_attention_s / prefill_attention_s in plain float arithmetic."""

    launch_s: float
    min_s: float
    pair_s: float  # compute per query-key pair
    token_s: float  # HBM read per KV token

    def seconds(self, pairs: float, kv_tokens: float) -> float:
        compute, memory = pairs * self.pair_s, kv_tokens * self.token_s
        t = self.launch_s + (compute if compute >= memory else memory)
        return t if t >= self.min_s else self.min_s


def attention_costs(flops_per_pair: float, kv_bytes_per_token: float, flops_per_s: float,
                    bytes_per_s: float, params: RooflineParams
                    ) -> tuple[AttentionCost, AttentionCost]:
    """(decode, prefill) kernels of a layer with these FLOPs per pair and KV bytes per token."""
    pair_s = flops_per_pair / (flops_per_s * params.attention_compute_efficiency)
    token_s = kv_bytes_per_token / (bytes_per_s * params.attention_bandwidth_efficiency)
    return (AttentionCost(params.decode_attention_launch_s, params.attention_min_s, pair_s,
                          token_s),
            AttentionCost(params.prefill_attention_launch_s, params.attention_min_s, pair_s,
                          token_s))


def lm_head_s(dims: LayerDims, seqs: Any, flops_per_s: float, bytes_per_s: float,
              params: RooflineParams, dtype_bytes: float = 2) -> Any:
    """The lm_head GEMM over the sequences that emit a token, then sampling's logit traffic."""
    return gemm_s(seqs, dims.hidden, dims.vocab, flops_per_s, bytes_per_s, params,
                  dtype_bytes) + sampling_s(dims, seqs, bytes_per_s, params)


def sampling_s(dims: LayerDims, seqs: Any, bytes_per_s: float, params: RooflineParams) -> Any:
    """Sampling's fp32 logits: written by lm_head, read for the softmax, probabilities read."""
    return seqs * dims.vocab * SAMPLING_BYTES_PER_LOGIT / (
        bytes_per_s * params.bandwidth_efficiency)


def cpu_overhead_s(seqs: Any, params: RooflineParams) -> Any:
    """Host time around one step of `seqs` sequences."""
    return params.cpu_step_s + params.cpu_seq_s * seqs


# ---------------------------------------------------------------- the fitted constants
# Produced by `python -m calibrate.fit_roofline` (prints the train / held-out split) on
# calibration/measured/ as its README pins it (Vidur 7d47513, LLMServingSim 5f18d86,
# inference-sim a410740). Attention and CPU terms: see each family's fitted_on.
FAMILIES: MappingProxyType[str, RooflineParams] = MappingProxyType({
    "ampere": RooflineParams(
        "ampere", bandwidth_efficiency=0.9093, compute_efficiency=0.7051,
        transition_sharpness=2.085, gemm_tile_rows=64, gemm_tile_cols=32, gemm_wave_tiles=108,
        gemm_launch_s=4.737e-06, layer_small_s=1.882e-05,
        attention_bandwidth_efficiency=0.9239, attention_compute_efficiency=0.7295,
        decode_attention_launch_s=1.474e-05, prefill_attention_launch_s=2.732e-05,
        attention_min_s=2.38e-05, cpu_step_s=0.001433, cpu_seq_s=4.13e-05,
        fitted_on="A100 stacks: Vidur Llama-2-7B/70B, Qwen-72B, Llama-3-8B, phi-2 (tp 1-2); "
                  "waves of 108 tiles (A100's SMs); attention: the hopper fit; CPU: Vidur "
                  "A100 host overheads"),
    "hopper": RooflineParams(
        "hopper", bandwidth_efficiency=0.95, compute_efficiency=0.6825,
        transition_sharpness=2.433, gemm_tile_rows=128, gemm_tile_cols=32, gemm_wave_tiles=132,
        gemm_launch_s=4.414e-06, layer_small_s=1.775e-05,
        attention_bandwidth_efficiency=0.9239, attention_compute_efficiency=0.7295,
        decode_attention_launch_s=1.474e-05, prefill_attention_launch_s=2.732e-05,
        attention_min_s=2.38e-05, cpu_step_s=0.001433, cpu_seq_s=4.13e-05,
        fitted_on="H100 stacks: Vidur Llama-2-7B/70B, Qwen-72B, phi-2 (tp 1-2); waves of 132 "
                  "tiles (H100's SMs); attention: inference-sim H100 decode and prefill; CPU: "
                  "Vidur A100 host overheads (no H100 host data)"),
})

# Catalogue GPU -> (family, why): a GPU without measured kernels takes its nearest family.
GPU_FAMILIES: MappingProxyType[str, tuple[str, str]] = MappingProxyType({
    "a100-80gb": ("ampere", "fitted on measured A100-80GB kernels"),
    "h100-sxm": ("hopper", "fitted on measured H100-SXM kernels"),
    "a100-40gb": ("ampere", "no measured kernels: A100-80GB's fit, the same die"),
    "h100-pcie": ("hopper", "no measured kernels: H100-SXM's fit, the same architecture"),
    "h200": ("hopper", "no measured kernels: H100-SXM's fit, the same Hopper die"),
    "b200": ("hopper", "no measured kernels: H100-SXM's fit, the nearest family"),
    "gb200": ("hopper", "no measured kernels: H100-SXM's fit, the nearest family"),
    "b300": ("hopper", "no measured kernels: H100-SXM's fit, the nearest family"),
    "l40s": ("ampere", "no measured kernels: A100's fit, the nearest family"),
    "l4": ("ampere", "no measured kernels: A100's fit, the nearest family"),
    "a10g": ("ampere", "no measured kernels: A100's fit, the same Ampere architecture"),
    "rtx-4090": ("ampere", "no measured kernels: A100's fit, the nearest family"),
    "mi300x": ("hopper", "no measured kernels: H100-SXM's fit, the nearest in bandwidth "
                         "and FLOP/s"),
    "mi325x": ("hopper", "no measured kernels: H100-SXM's fit, as MI300X"),
    "mi355x": ("hopper", "no measured kernels: H100-SXM's fit, as MI300X"),
})
DEFAULT_FAMILY = "hopper"


def family_of(gpu_name: str, sm_count: int = 0) -> tuple[str, str]:
    """(family, why) for a GPU; a custom one takes the default family and says so."""
    waves = f"in waves of its {sm_count} SMs" if sm_count else "without waves (its SMs are " \
                                                              "unknown)"
    return GPU_FAMILIES.get(gpu_name, (DEFAULT_FAMILY, f"custom GPU: the {DEFAULT_FAMILY} "
                                                       f"family's fit, {waves}"))


def params_for(gpu_name: str, sm_count: int = 0) -> RooflineParams:
    """The family's fit, its waves as wide as this GPU's SMs (`sm_count`, 0 = unknown).

    A catalogue GPU names its SM count, so an L4 runs its GEMM tiles 58 at a time, not
    its family's 108. A custom GPU of unknown SMs pads its GEMMs to tiles but runs no
    waves: a wave of the family's would price each tile at a share of a peak it may not
    have (a CPU-sized device would pay for 132 SMs it lacks)."""
    params = FAMILIES[family_of(gpu_name)[0]]
    if sm_count:
        return dataclasses.replace(params, gemm_wave_tiles=float(sm_count))
    if gpu_name in GPU_FAMILIES:
        return params
    return dataclasses.replace(params, gemm_wave_tiles=1.0)
