"""Published real-GPU linear-op stacks (Vidur, LLMServingSim) as typed records.

These are the measurements the roofline is held to: other projects profiled
the kernels of real models on A100 and H100 GPUs and published the tables
under MIT licences. `calibration/measured/regenerate.py` trims them into
`calibration/measured/<source>/`; each source's PROVENANCE.md says from which
commit and file. This module only reads them: per-op kernel time **per
layer, per GPU, in ms**, by token rows (one forward over `num_tokens` rows,
attention itself excluded), with the once-per-step ops (embedding, final
norm, lm_head) kept apart. Attention, GEMM, CPU-overhead and collective
tables are read by calibrate.published.kernels.

Op names are unified across sources (LLMServingSim's separate q/k/v and
gate/up projections are summed into `qkv_proj` and `up_proj`), so one stack
sum means the same thing whoever measured it. A source lacks an op it did
not time (LLMServingSim has no residual add, phi-2 no post-attention norm):
sums run over the ops present.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "calibration" / "measured"
# what a test that needs the tables says when they are absent (they may not be committed)
MISSING = ("calibration/measured/{vidur,llmservingsim,inference_sim} absent: third-party "
           "kernel tables, never committed; `.ci/run` copies them from the shared folder "
           "beside the checkout, "
           "`python calibration/measured/regenerate.py` fetches them (calibration/measured/"
           "README.md)")

LAYER_GEMMS = ("qkv_proj", "o_proj", "up_proj", "down_proj")
LAYER_SMALL = ("input_norm", "post_attn_norm", "rope", "act", "residual_add")
STEP_OPS = ("embedding", "final_norm", "lm_head")

# source column -> canonical op; several columns mapping to one op are summed.
_VIDUR_OPS = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj",
              "mlp_up_proj": "up_proj", "mlp_down_proj": "down_proj",
              "input_layernorm": "input_norm", "post_attention_layernorm": "post_attn_norm",
              "attn_rope": "rope", "mlp_act": "act", "add": "residual_add", "emb": "embedding"}
_LSS_OPS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
            "o_proj": "o_proj", "gate_proj": "up_proj", "up_proj": "up_proj",
            "down_proj": "down_proj", "input_layernorm": "input_norm",
            "post_layernorm": "post_attn_norm", "rope": "rope", "act_fn": "act",
            "embedding": "embedding", "final_layernorm": "final_norm", "lm_head": "lm_head"}
_NS_PER_MS = 1e6


class MeasuredDataError(ValueError):
    """A measured-data file is missing or not in the shape this loader expects."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What sizes a decoder's kernels: all head counts unsharded (tp divides them later)."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    gated: bool  # gate and up projections (SwiGLU) rather than one up projection

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                     "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise MeasuredDataError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class Fixture:
    """One measured configuration: who measured which model on which device at which tp."""

    source: str
    device: str  # "a100" | "h100"
    model: str  # the source's name, e.g. "meta-llama/Llama-2-7b-hf"
    tp: int


@dataclass(frozen=True, slots=True)
class LinearOpRow:
    """Kernel times of one forward over `num_tokens` rows, attention excluded."""

    fixture: Fixture
    shape: ModelShape
    num_tokens: int
    layer_ops_ms: tuple[tuple[str, float], ...]  # per layer, in LAYER_GEMMS + LAYER_SMALL order
    step_ops_ms: tuple[tuple[str, float], ...]  # once per step, in STEP_OPS order

    def op_ms(self, op: str) -> float | None:
        """One op's time (per layer for layer ops), None where the source did not time it."""
        return dict(self.layer_ops_ms + self.step_ops_ms).get(op)

    @property
    def gemm_ms(self) -> float:
        """The four projections of one layer."""
        return sum(ms for op, ms in self.layer_ops_ms if op in LAYER_GEMMS)

    @property
    def small_ms(self) -> float:
        """Norms, rope, activation and residual add of one layer."""
        return sum(ms for op, ms in self.layer_ops_ms if op in LAYER_SMALL)

    @property
    def layer_ms(self) -> float:
        return self.gemm_ms + self.small_ms

    @property
    def stack_ms(self) -> float:
        """The linear-op stack of a step: every layer's ops, as Vidur composes a step."""
        return self.shape.num_layers * self.layer_ms


def read_columns(path: Path, columns: Iterable[str]) -> pd.DataFrame:
    """The CSV at `path`, refused with the reason when a named column is missing."""
    if not path.is_file():
        raise MeasuredDataError(f"{path}: missing; calibration/measured/regenerate.py "
                                f"writes it from the source project's checkout")
    df = pd.read_csv(path)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise MeasuredDataError(f"{path}: no column {', '.join(missing)}")
    return df


def _models(path: Path) -> dict[str, dict]:
    return {row["model"]: row for row in read_columns(path, ["model", "num_layers"])
            .to_dict("records")}


def _ordered(ops_ms: Mapping[str, float], order: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    return tuple((op, float(ops_ms[op])) for op in order if op in ops_ms)


def _row(fixture: Fixture, shape: ModelShape, num_tokens: int,
         ops_ms: Mapping[str, float]) -> LinearOpRow:
    return LinearOpRow(fixture, shape, int(num_tokens),
                       _ordered(ops_ms, LAYER_GEMMS + LAYER_SMALL), _ordered(ops_ms, STEP_OPS))


def _canonical(row: Mapping[str, float], names: Mapping[str, str], column: str,
               scale: float) -> dict[str, float]:
    """Source columns -> canonical op times in ms (summing the columns one op spans)."""
    ops: dict[str, float] = {}
    for name, op in names.items():
        key = column.format(name)
        if key in row and pd.notna(row[key]):
            ops[op] = ops.get(op, 0.0) + float(row[key]) / scale
    return ops


def _constant(df: pd.DataFrame, path: Path, column: str) -> object:
    values = df[column].unique()
    if len(values) != 1:
        raise MeasuredDataError(f"{path}: {column} takes {len(values)} values, expected one")
    return values[0].item() if hasattr(values[0], "item") else values[0]


def load_vidur_linear_ops(root: Path = DEFAULT_ROOT) -> tuple[LinearOpRow, ...]:
    """Every `vidur/compute/<device>/<org>/<model>/mlp.csv`, all tp, rows in file order."""
    base = root / "vidur"
    models = _models(base / "models.csv")
    rows: list[LinearOpRow] = []
    for path in sorted((base / "compute").glob("*/*/*/mlp.csv")):
        device, org, name = path.parts[-4:-1]
        model = f"{org}/{name}"
        if model not in models:
            raise MeasuredDataError(f"{base / 'models.csv'}: no layer count for {model}")
        keys = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"]
        df = read_columns(path, keys)
        hidden, heads = int(_constant(df, path, "n_embd")), int(_constant(df, path, "n_head"))
        shape = ModelShape(int(models[model]["num_layers"]), hidden, heads,
                           int(_constant(df, path, "n_kv_head")), hidden // heads,
                           int(_constant(df, path, "n_expanded_embd")),
                           int(_constant(df, path, "vocab_size")),
                           bool(_constant(df, path, "use_gated_mlp")))
        for record in df.to_dict("records"):
            fixture = Fixture("vidur", device, model, int(record["num_tensor_parallel_workers"]))
            ops = _canonical(record, _VIDUR_OPS, "time_stats.{}.median", 1.0)
            rows.append(_row(fixture, shape, record["num_tokens"], ops))
    return tuple(rows)


def load_llmservingsim_linear_ops(root: Path = DEFAULT_ROOT) -> tuple[LinearOpRow, ...]:
    """Every `llmservingsim/<DEVICE>/<org>/<model>/tp<N>/layers.csv` (latencies in ns)."""
    base = root / "llmservingsim"
    models = _models(base / "models.csv")
    rows: list[LinearOpRow] = []
    for path in sorted(base.glob("*/*/*/tp*/layers.csv")):
        device, org, name, tp_dir = path.parts[-5:-1]
        model = f"{org}/{name}"
        if model not in models:
            raise MeasuredDataError(f"{base / 'models.csv'}: no shape for {model}")
        m = models[model]
        shape = ModelShape(int(m["num_layers"]), int(m["hidden"]), int(m["heads"]),
                           int(m["kv_heads"]), int(m["head_dim"]), int(m["intermediate"]),
                           int(m["vocab"]), bool(m["gated"]))
        df = read_columns(path, ["num_tokens", "tp_size"] + [f"{n}_ns" for n in _LSS_OPS])
        tp = int(_constant(df, path, "tp_size"))
        if tp_dir != f"tp{tp}":
            raise MeasuredDataError(f"{path}: tp_size {tp} under folder {tp_dir}")
        fixture = Fixture("llmservingsim", device.lower(), model, tp)
        for record in df.to_dict("records"):
            ops = _canonical(record, _LSS_OPS, "{}_ns", _NS_PER_MS)
            rows.append(_row(fixture, shape, record["num_tokens"], ops))
    return tuple(rows)


def load_linear_ops(root: Path = DEFAULT_ROOT) -> tuple[LinearOpRow, ...]:
    return load_vidur_linear_ops(root) + load_llmservingsim_linear_ops(root)


def by_fixture(rows: Iterable[LinearOpRow]) -> dict[Fixture, tuple[LinearOpRow, ...]]:
    """Rows grouped per fixture, each group sorted by token rows (repeats kept)."""
    groups: dict[Fixture, list[LinearOpRow]] = {}
    for row in rows:
        groups.setdefault(row.fixture, []).append(row)
    return {f: tuple(sorted(g, key=lambda r: r.num_tokens)) for f, g in sorted(
        groups.items(), key=lambda item: (item[0].device, item[0].source, item[0].model,
                                          item[0].tp))}
