"""A published GPU profile's tables read: what Vidur or LLMServingSim timed, per layer, in ms.

calibrate.published.import_profile composes steps from a `Profile`; reading the
projects' published CSV layouts (their columns, their units, the model and
tensor-parallel checks) is apart from that composition, so each reads alone:
`read_vidur` (mlp.csv, attention.csv, cpu_overheads.csv) and
`read_llmservingsim` (layers.csv) turn them into per-token-count `Curve`s and
bilinear `GridLookup`s of attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.published.measured import MeasuredDataError, read_columns
from sim.config.specs import ModelSpec
from sim.latency.table_format import TableError

_VIDUR_LAYER_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj",
                    "input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
_LSS_LAYER_OPS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                  "input_layernorm", "post_layernorm", "rope", "act_fn")
_LSS_STEP_OPS = ("embedding", "final_layernorm", "lm_head")
_HOST_STAGES = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
                "process_model_outputs_median")


@dataclass(frozen=True, slots=True)
class Curve:
    """A per-token-count time, ms, linear between measured counts and past the last two."""

    tokens: tuple[float, ...]
    ms: tuple[float, ...]

    def __call__(self, rows: float) -> float:
        t, y = self.tokens, self.ms
        if rows <= t[-1] or len(t) < 2:
            return float(np.interp(rows, t, y))
        slope = (y[-1] - y[-2]) / (t[-1] - t[-2])
        return y[-1] + slope * (rows - t[-1])


@dataclass(frozen=True, slots=True)
class Profile:
    """What one published profile times, per GPU, in ms."""

    source: str
    layer_ms: Curve  # every per-layer op but attention, by token rows
    step_ms: Curve  # once-per-step ops it timed by token rows (embedding, final norm)
    lm_head_ms: Curve | None  # lm_head by the rows it runs over (a step's sequences)
    decode_attention: GridLookup | None  # (batch, KV tokens per sequence) -> ms a layer
    prefill_attention: GridLookup | None  # (chunk, context) -> ms a layer
    cpu_ms: tuple[float, float] | None  # (per step, per sequence)
    files: tuple[Path, ...]



def _require(path: Path) -> Path:
    if not path.is_file():
        raise TableError(f"{path}: missing (the profile's published file)")
    return path


def _check_shape(path: Path, df: pd.DataFrame, spec: ModelSpec) -> None:
    expected = {"n_embd": spec.hidden_size, "n_head": spec.num_heads,
                "n_kv_head": spec.num_kv_heads, "n_expanded_embd": spec.intermediate_size}
    for column, value in expected.items():
        found = set(df[column].astype(int))
        if found != {value}:
            raise TableError(f"{path}: {column} is {sorted(found)}, the model --model names "
                             f"has {value}; import a profile of this model")


@dataclass(frozen=True, slots=True, eq=False)
class GridLookup:
    """Bilinear interpolation over a measured (x, y) grid of per-layer ms; `clamp` says
    which measured point stands for one outside it."""

    xs: np.ndarray
    ys: np.ndarray
    ms: np.ndarray  # len(xs) x len(ys)

    @classmethod
    def of(cls, points: pd.DataFrame, x: str, y: str, value: str) -> GridLookup:
        table = points.pivot_table(index=x, columns=y, values=value, aggfunc="median")
        table = table.interpolate(axis=1, limit_direction="both").interpolate(
            axis=0, limit_direction="both")
        return cls(table.index.to_numpy(float), table.columns.to_numpy(float), table.to_numpy())

    def clamp(self, px: float, py: float) -> tuple[float, float]:
        return (min(max(px, self.xs[0]), self.xs[-1]), min(max(py, self.ys[0]), self.ys[-1]))

    def __call__(self, px: float, py: float) -> float:
        px, py = self.clamp(px, py)
        column = np.array([np.interp(py, self.ys, row) for row in self.ms])
        return float(np.interp(px, self.xs, column))


def read_vidur(directory: Path, spec: ModelSpec, tp: int, attention: Path | None,
               cpu_overheads: Path | None) -> Profile:
    mlp = _require(directory / "mlp.csv")
    keys = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens",
            "num_tensor_parallel_workers"]
    try:
        df = read_columns(mlp, keys + [f"time_stats.{op}.median" for op in ("attn_pre_proj",
                                                                           "mlp_down_proj")])
    except MeasuredDataError as err:
        raise TableError(str(err)) from None
    _check_shape(mlp, df, spec)
    df = df[df["num_tensor_parallel_workers"] == tp]
    if df.empty:
        raise TableError(f"{mlp}: no rows at num_tensor_parallel_workers {tp}; --tp must be one "
                         f"the profile measured")
    ops = [f"time_stats.{op}.median" for op in _VIDUR_LAYER_OPS
           if f"time_stats.{op}.median" in df.columns]
    by_tokens = df.groupby("num_tokens").median(numeric_only=True).sort_index()
    tokens = tuple(by_tokens.index.astype(float))
    layer = Curve(tokens, tuple(by_tokens[ops].sum(axis=1)))
    emb = "time_stats.emb.median"
    step = Curve(tokens, tuple(by_tokens[emb]) if emb in by_tokens else (0.0,) * len(tokens))
    files = [mlp]
    attention = attention if attention is not None else (
        directory / "attention.csv" if (directory / "attention.csv").is_file() else None)
    decode = prefill = None
    if attention is not None:
        files.append(_require(attention))
        att = pd.read_csv(attention)
        att = att[(att["num_tensor_parallel_workers"] == tp) & (att["n_q_head"] == spec.num_heads)
                  & (att["n_kv_head"] == spec.num_kv_heads)]
        if att.empty:
            raise TableError(f"{attention}: no rows for {spec.num_heads} q / "
                             f"{spec.num_kv_heads} kv heads at tp {tp}")
        dec, pre = att[~att["is_prefill"].astype(bool)], att[att["is_prefill"].astype(bool)]
        decode = GridLookup.of(dec, "batch_size", "kv_cache_size",
                               "time_stats.attn_decode.median")
        prefill = GridLookup.of(pre, "prefill_chunk_size", "kv_cache_size",
                                "time_stats.attn_prefill.median")
    cpu = None
    if cpu_overheads is not None:
        files.append(_require(cpu_overheads))
        host = pd.read_csv(cpu_overheads)
        host = host[(host["model_name"].str.split("/").str[-1].str.lower()
                     == directory.name.lower()) & (host["tensor_parallel_degree"] == tp)]
        if len(host) < 2:
            raise TableError(f"{cpu_overheads}: fewer than 2 rows for {directory.name} at tp {tp}")
        slope, intercept = np.polyfit(host["batch_size"], host[list(_HOST_STAGES)].sum(axis=1), 1)
        cpu = (max(float(intercept), 0.0), max(float(slope), 0.0))
    return Profile("vidur", layer, step, None, decode, prefill, cpu, tuple(files))


def read_llmservingsim(directory: Path, spec: ModelSpec, tp: int) -> Profile:
    path = _require(directory / "layers.csv")
    try:
        df = read_columns(path, ["layer_name", "input", "kv_cache", "tp_size", "latency(ns)"])
    except MeasuredDataError as err:
        raise TableError(str(err)) from None
    if set(df["tp_size"]) != {tp}:
        raise TableError(f"{path}: tp_size is {sorted(set(df['tp_size']))}, --tp is {tp}")
    wide = df[df["kv_cache"] == 0].pivot_table(index="input", columns="layer_name",
                                                values="latency(ns)", aggfunc="median") / 1e6
    missing = [op for op in _LSS_LAYER_OPS if op not in wide.columns]
    if missing:
        raise TableError(f"{path}: no rows for layer_name {', '.join(missing)}")
    tokens = tuple(wide.index.astype(float))
    layer = Curve(tokens, tuple(wide[list(_LSS_LAYER_OPS)].sum(axis=1)))
    step_ops = [op for op in _LSS_STEP_OPS if op in wide.columns]
    # lm_head is timed over `input` rows; a step runs it over its sequences
    step = Curve(tokens, tuple(wide[[op for op in step_ops if op != "lm_head"]].sum(axis=1)))
    lm_head = Curve(tokens, tuple(wide["lm_head"])) if "lm_head" in wide.columns else None
    return Profile("llmservingsim", layer, step, lm_head, None, None, None, (path,))

