"""The roofline's terms, each a small physical law of one kernel's or the host's time.

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
- CPU overhead: a per-step and a per-sequence term; serial with the GPU in
  a synchronous engine, mostly overlapped with it under async scheduling
  (`visible_host_s`).

Prefill stays compute-bound and decode memory-bound because of the shapes:
a step reads each weight once however many rows it multiplies.

The constants (sim.latency.roofline_fits) come from `python -m calibrate.published.fit_roofline`,
which fits them per family on published kernel timings (calibration/measured/, Vidur,
LLMServingSim, inference-sim) and prints the held-out models' errors.
Every function is pure and works on floats and numpy arrays alike.
"""

from __future__ import annotations

from math import ceil
from typing import Any, NamedTuple

import numpy as np

from sim.latency.roofline_fits import RooflineParams

SAMPLING_BYTES_PER_LOGIT = 3 * 4  # fp32 logits written, read for softmax, probabilities read


class LayerDims(NamedTuple):
    """What sizes one GPU's kernels: every width already divided by tensor parallelism.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

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


class GemmCost(NamedTuple):
    """One GEMM's constants, derived once: time = launch + soft max(memory, compute).

    Compute goes by waves: the rows padded to whole tiles, times the column tiles, make
    the tiles; the GPU runs `wave_tiles` of them at once, each wave taking `wave_s`.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

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


class AttentionCost(NamedTuple):
    """One layer's attention kernel of one kind (decode or prefill) on one model, derived
    once: the law of decode_attention_s / prefill_attention_s in plain float arithmetic.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

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


def visible_host_s(host_s: float, gpu_s: float, serial_share: float) -> float:
    """The host time a step adds to its GPU time under async scheduling.

    vLLM's async engine core schedules and prepares step n+1, and processes step n-1's
    outputs, while step n runs on the GPU. A `serial_share` of the host's work still
    waits on the GPU (and the GPU on it); the rest overlaps and costs time only where it
    outlasts the GPU's step. serial_share = 1 is the synchronous engine: all of it."""
    overlapped_s = (1.0 - serial_share) * host_s
    excess_s = overlapped_s - gpu_s
    return serial_share * host_s + (excess_s if excess_s > 0.0 else 0.0)
