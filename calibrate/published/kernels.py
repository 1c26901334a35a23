"""Published attention, GEMM, CPU-overhead and collective timings as typed records.

The companion of calibrate.published.measured (linear-op stacks), over the same
`calibration/measured/` tree, one unit per kind:

- attention: **per layer, per GPU, in µs**; decode by batch and KV length,
  prefill by chunk and the context before it (inference-sim's H100 tables,
  bf16; Vidur's one A100 table, an early-2024 vLLM kernel);
- GEMMs in µs: inference-sim's H100 table is faster than bf16 allows (up to
  1.27x datasheet HBM at m = 8, 1.3x bf16 peak at large m), which fits FP8
  inputs, as the harness it copies (InferSim, DeepGEMM) uses: do not hold
  a bf16 roofline to it;
- CPU overheads and collectives in ms (Vidur, A100 host; NVLink nodes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from calibrate.published.measured import DEFAULT_ROOT, MeasuredDataError, read_columns

_US_PER_MS = 1e3


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """Heads of one attention layer; tables name them unsharded, with the tp they ran at."""

    q_heads: int  # unsharded; a GPU runs q_heads / tp of them
    kv_heads: int
    head_dim: int
    tp: int


@dataclass(frozen=True, slots=True)
class DecodeAttentionPoint:
    """One decode attention kernel: `batch` sequences of `kv_tokens` cached each."""

    source: str
    device: str
    attention: AttentionShape
    batch: int
    kv_tokens: int
    time_us: float  # per layer, per GPU


@dataclass(frozen=True, slots=True)
class PrefillAttentionPoint:
    """One prefill attention kernel: a `chunk_tokens` chunk after `context_tokens` cached."""

    source: str
    device: str
    attention: AttentionShape
    chunk_tokens: int
    context_tokens: int
    time_us: float  # per layer, per GPU


@dataclass(frozen=True, slots=True)
class GemmPoint:
    """(m x k) @ (k x n); inference-sim's H100 table reads as FP8 (see the module doc)."""

    source: str
    device: str
    m: int
    k: int
    n: int
    time_us: float


@dataclass(frozen=True, slots=True)
class CpuOverheadPoint:
    """Host time around one step of a vLLM-style engine, by stage, in ms."""

    source: str
    device: str
    model: str
    batch: int
    tp: int
    stages_ms: tuple[tuple[str, float], ...]

    @property
    def total_ms(self) -> float:
        return sum(ms for _, ms in self.stages_ms)


@dataclass(frozen=True, slots=True)
class CollectivePoint:
    """One collective (all_reduce or send_recv) of `size_bytes` over `num_workers` GPUs."""

    source: str
    node: str  # e.g. "h100_dgx"
    kind: str
    num_workers: int
    devices_per_node: int
    size_bytes: int
    time_ms: float



_HEADS_FILE = re.compile(r"^(\d+)-(\d+)-(\d+)(?:-tp(\d+))?$")


def _heads(path: Path) -> AttentionShape:
    match = _HEADS_FILE.match(path.stem)
    if not match:
        raise MeasuredDataError(f"{path}: name is not <q_heads>-<kv_heads>-<head_dim>[-tp<N>]")
    q, kv, dim, tp = match.groups()
    return AttentionShape(int(q), int(kv), int(dim), int(tp or 1))


def _bf16_only(df: pd.DataFrame, path: Path, columns: Iterable[str]) -> None:
    for column in columns:
        if set(df[column]) != {"bf16"}:
            raise MeasuredDataError(f"{path}: {column} is not bf16 throughout")


def load_decode_attention(root: Path = DEFAULT_ROOT) -> tuple[DecodeAttentionPoint, ...]:
    """inference-sim's H100 tables and Vidur's one A100 decode table."""
    points: list[DecodeAttentionPoint] = []
    for path in sorted((root / "inference_sim" / "mha" / "decode").glob("*/*.csv")):
        df = read_columns(path, ["dtype", "kv_dtype", "batch_size", "kv_len", "latency_us"])
        _bf16_only(df, path, ["dtype", "kv_dtype"])
        shape = _heads(path)
        points += [DecodeAttentionPoint("inference_sim", path.parent.name, shape, int(b),
                                        int(kv), float(us))
                   for b, kv, us in df[["batch_size", "kv_len", "latency_us"]].itertuples(
                       index=False)]
    for device, df, _ in _vidur_attention(root):
        decode = df[~df["is_prefill"]]
        points += [DecodeAttentionPoint("vidur", device, _vidur_shape(r), int(r["batch_size"]),
                                        int(r["kv_cache_size"]),
                                        float(r["time_stats.attn_decode.median"]) * _US_PER_MS)
                   for r in decode.to_dict("records")]
    return tuple(points)


def load_prefill_attention(root: Path = DEFAULT_ROOT) -> tuple[PrefillAttentionPoint, ...]:
    """inference-sim's H100 tables (one sequence from empty) and Vidur's A100 chunks."""
    points: list[PrefillAttentionPoint] = []
    for path in sorted((root / "inference_sim" / "mha" / "prefill").glob("*/*.csv")):
        df = read_columns(path, ["dtype", "seq_len", "latency_us"])
        _bf16_only(df, path, ["dtype"])
        shape = _heads(path)
        points += [PrefillAttentionPoint("inference_sim", path.parent.name, shape, int(n), 0,
                                         float(us))
                   for n, us in df[["seq_len", "latency_us"]].itertuples(index=False)]
    for device, df, path in _vidur_attention(root):
        prefill = df[df["is_prefill"]]
        if set(prefill["batch_size"]) - {1}:
            raise MeasuredDataError(f"{path}: prefill rows of batch other than 1")
        points += [PrefillAttentionPoint("vidur", device, _vidur_shape(r),
                                         int(r["prefill_chunk_size"]), int(r["kv_cache_size"]),
                                         float(r["time_stats.attn_prefill.median"]) * _US_PER_MS)
                   for r in prefill.to_dict("records")]
    return tuple(points)


def _vidur_attention(root: Path) -> list[tuple[str, pd.DataFrame, Path]]:
    cols = ["n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "is_prefill",
            "batch_size", "prefill_chunk_size", "kv_cache_size",
            "time_stats.attn_decode.median", "time_stats.attn_prefill.median"]
    return [(path.parent.name, read_columns(path, cols), path)
            for path in sorted((root / "vidur" / "attention").glob("*/attention.csv"))]


def _vidur_shape(record: Mapping) -> AttentionShape:
    heads = int(record["n_q_head"])
    return AttentionShape(heads, int(record["n_kv_head"]), int(record["n_embd"]) // heads,
                          int(record["num_tensor_parallel_workers"]))


def load_gemms(root: Path = DEFAULT_ROOT) -> tuple[GemmPoint, ...]:
    points: list[GemmPoint] = []
    for path in sorted((root / "inference_sim" / "gemm").glob("*/data.csv")):
        df = read_columns(path, ["m", "k", "n", "latency_us"])
        points += [GemmPoint("inference_sim", path.parent.name, int(m), int(k), int(n),
                             float(us)) for m, k, n, us in df.itertuples(index=False)]
    return tuple(points)


# Vidur's host stages; ray_comm has a mean only.
CPU_STAGES = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
              "process_model_outputs_median", "ray_comm_time_mean")


def load_cpu_overheads(root: Path = DEFAULT_ROOT) -> tuple[CpuOverheadPoint, ...]:
    points: list[CpuOverheadPoint] = []
    for path in sorted((root / "vidur" / "cpu_overheads").glob("*/cpu_overheads.csv")):
        df = read_columns(path, ["model_name", "batch_size", "tensor_parallel_degree", *CPU_STAGES])
        points += [CpuOverheadPoint("vidur", path.parent.name, r["model_name"],
                                    int(r["batch_size"]), int(r["tensor_parallel_degree"]),
                                    tuple((s, float(r[s])) for s in CPU_STAGES))
                   for r in df.to_dict("records")]
    return tuple(points)


def load_collectives(root: Path = DEFAULT_ROOT) -> tuple[CollectivePoint, ...]:
    points: list[CollectivePoint] = []
    for path in sorted((root / "vidur" / "network").glob("*/*.csv")):
        kind = path.stem
        column = f"time_stats.{kind}.median"
        df = read_columns(path, ["num_workers", "devices_per_node", "size", column])
        points += [CollectivePoint("vidur", path.parent.name, kind, int(w), int(d), int(s),
                                   float(ms))
                   for w, d, s, ms in df[["num_workers", "devices_per_node", "size",
                                          column]].itertuples(index=False)]
    return tuple(points)
