"""The measured-data loaders: shapes parsed, units converted, ops summed, bad files refused.

Each test writes a tiny tree in the trimmed format of calibration/measured/
with numbers chosen here, so the expected sums are known exactly; the last
tests read the real trimmed tables where they are present.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from calibrate.published.kernels import (
    AttentionShape,
    load_cpu_overheads,
    load_decode_attention,
    load_prefill_attention,
)
from calibrate.published.measured import (
    DEFAULT_ROOT,
    MISSING,
    Fixture,
    MeasuredDataError,
    ModelShape,
    by_fixture,
    load_linear_ops,
    load_llmservingsim_linear_ops,
    load_vidur_linear_ops,
)

VIDUR_MS = {"emb": 0.5, "input_layernorm": 0.01, "attn_pre_proj": 0.2, "attn_rope": 0.02,
            "attn_post_proj": 0.1, "post_attention_layernorm": 0.01, "mlp_up_proj": 0.4,
            "mlp_act": 0.03, "mlp_down_proj": 0.3, "add": 0.005}
SHAPE_KEYS = {"n_head": 32, "n_kv_head": 8, "n_embd": 4096, "n_expanded_embd": 14336,
              "vocab_size": 128256, "use_gated_mlp": True}


def _vidur_tree(root: Path, rows: list[dict] | None = None, layers: int = 32) -> Path:
    folder = root / "vidur" / "compute" / "h100" / "org" / "m"
    folder.mkdir(parents=True)
    if rows is None:
        rows = [{**{f"time_stats.{op}.median": ms * scale for op, ms in VIDUR_MS.items()},
                 **SHAPE_KEYS, "num_tokens": tokens, "num_tensor_parallel_workers": tp}
                for tokens, tp, scale in ((64, 1, 1.0), (1, 1, 0.5), (1, 2, 0.25))]
    pd.DataFrame(rows).to_csv(folder / "mlp.csv", index=False)
    pd.DataFrame([{"model": "org/m", "num_layers": layers}]).to_csv(
        root / "vidur" / "models.csv", index=False)
    return folder / "mlp.csv"


def test_vidur_shape_ops_and_sums(tmp_path: Path) -> None:
    _vidur_tree(tmp_path)
    rows = load_vidur_linear_ops(tmp_path)
    assert len(rows) == 3
    row = next(r for r in rows if r.num_tokens == 64)
    assert row.fixture == Fixture("vidur", "h100", "org/m", 1)
    assert row.shape == ModelShape(32, 4096, 32, 8, 128, 14336, 128256, True)
    assert row.op_ms("qkv_proj") == 0.2 and row.op_ms("up_proj") == 0.4
    assert row.op_ms("lm_head") is None  # Vidur does not time it
    assert row.gemm_ms == pytest.approx(0.2 + 0.1 + 0.4 + 0.3)
    assert row.small_ms == pytest.approx(0.01 + 0.02 + 0.01 + 0.03 + 0.005)
    # The embedding runs once per step and stays out of the per-layer stack.
    assert row.step_ops_ms == (("embedding", 0.5),)
    assert row.stack_ms == pytest.approx(32 * 1.075)


def test_vidur_layer_count_scales_the_stack(tmp_path: Path) -> None:
    _vidur_tree(tmp_path, layers=80)
    row = next(r for r in load_vidur_linear_ops(tmp_path) if r.num_tokens == 64)
    assert row.stack_ms == pytest.approx(80 * 1.075)


def test_ungated_model_without_post_attention_norm(tmp_path: Path) -> None:
    ops = {k: v for k, v in VIDUR_MS.items() if k != "post_attention_layernorm"}
    keys = {**SHAPE_KEYS, "use_gated_mlp": False, "n_kv_head": 32}
    _vidur_tree(tmp_path, [{**{f"time_stats.{op}.median": ms for op, ms in ops.items()},
                            **keys, "num_tokens": 8, "num_tensor_parallel_workers": 1}])
    (row,) = load_vidur_linear_ops(tmp_path)
    assert not row.shape.gated and row.shape.kv_heads == 32
    assert row.op_ms("post_attn_norm") is None
    assert row.small_ms == pytest.approx(0.01 + 0.02 + 0.03 + 0.005)


def test_by_fixture_groups_and_sorts(tmp_path: Path) -> None:
    _vidur_tree(tmp_path)
    groups = by_fixture(load_vidur_linear_ops(tmp_path))
    assert list(groups) == [Fixture("vidur", "h100", "org/m", 1),
                            Fixture("vidur", "h100", "org/m", 2)]
    assert [r.num_tokens for r in groups[Fixture("vidur", "h100", "org/m", 1)]] == [1, 64]


def test_vidur_refuses_a_model_without_layer_count(tmp_path: Path) -> None:
    _vidur_tree(tmp_path)
    pd.DataFrame([{"model": "other/x", "num_layers": 2}]).to_csv(
        tmp_path / "vidur" / "models.csv", index=False)
    with pytest.raises(MeasuredDataError, match="no layer count for org/m"):
        load_vidur_linear_ops(tmp_path)


def test_vidur_refuses_two_shapes_in_one_file(tmp_path: Path) -> None:
    base = {**{f"time_stats.{op}.median": ms for op, ms in VIDUR_MS.items()},
            "num_tokens": 1, "num_tensor_parallel_workers": 1}
    _vidur_tree(tmp_path, [{**base, **SHAPE_KEYS}, {**base, **SHAPE_KEYS, "n_embd": 5120}])
    with pytest.raises(MeasuredDataError, match="n_embd takes 2 values"):
        load_vidur_linear_ops(tmp_path)


def test_missing_file_and_column_are_named(tmp_path: Path) -> None:
    with pytest.raises(MeasuredDataError, match="models.csv: missing"):
        load_vidur_linear_ops(tmp_path)
    path = _vidur_tree(tmp_path)
    pd.read_csv(path).drop(columns="vocab_size").to_csv(path, index=False)
    with pytest.raises(MeasuredDataError, match="no column vocab_size"):
        load_vidur_linear_ops(tmp_path)


LSS_NS = {"q_proj": 16000, "k_proj": 8000, "v_proj": 8000, "o_proj": 16000,
          "gate_proj": 40000, "up_proj": 40000, "down_proj": 42000, "input_layernorm": 17000,
          "post_layernorm": 17000, "rope": 27000, "act_fn": 4000, "embedding": 3000,
          "final_layernorm": 18000, "lm_head": 366000, "attn": 5800}
LSS_MODEL = {"model": "meta-llama/Llama-3.1-8B", "num_layers": 32, "hidden": 4096,
             "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 14336,
             "vocab": 128256, "gated": True}


def _lss_tree(root: Path, tp: int = 2, folder_tp: int | None = None) -> None:
    base = root / "llmservingsim"
    folder = base / "H100" / "meta-llama" / "Llama-3.1-8B" / f"tp{folder_tp or tp}"
    folder.mkdir(parents=True)
    row = {"num_tokens": 1, "tp_size": tp, **{f"{k}_ns": v for k, v in LSS_NS.items()}}
    pd.DataFrame([row]).to_csv(folder / "layers.csv", index=False)
    pd.DataFrame([LSS_MODEL]).to_csv(base / "models.csv", index=False)


def test_llmservingsim_sums_projections_and_converts_ns(tmp_path: Path) -> None:
    _lss_tree(tmp_path)
    (row,) = load_llmservingsim_linear_ops(tmp_path)
    assert row.fixture == Fixture("llmservingsim", "h100", "meta-llama/Llama-3.1-8B", 2)
    assert row.op_ms("qkv_proj") == pytest.approx(0.032)  # q + k + v
    assert row.op_ms("up_proj") == pytest.approx(0.080)  # gate + up
    assert row.op_ms("residual_add") is None
    assert row.gemm_ms == pytest.approx(0.032 + 0.016 + 0.080 + 0.042)
    assert row.small_ms == pytest.approx(0.017 + 0.017 + 0.027 + 0.004)
    assert dict(row.step_ops_ms) == pytest.approx(
        {"embedding": 0.003, "final_norm": 0.018, "lm_head": 0.366})
    # lm_head and attention are not part of the linear-op stack.
    assert row.stack_ms == pytest.approx(32 * (0.170 + 0.065))


def test_llmservingsim_refuses_tp_folder_mismatch(tmp_path: Path) -> None:
    _lss_tree(tmp_path, tp=2, folder_tp=1)
    with pytest.raises(MeasuredDataError, match="tp_size 2 under folder tp1"):
        load_llmservingsim_linear_ops(tmp_path)


def test_load_linear_ops_reads_both_sources(tmp_path: Path) -> None:
    _vidur_tree(tmp_path)
    _lss_tree(tmp_path)
    sources = {r.fixture.source for r in load_linear_ops(tmp_path)}
    assert sources == {"vidur", "llmservingsim"}


def _inference_sim_attention(root: Path, dtype: str = "bf16") -> None:
    decode = root / "inference_sim" / "mha" / "decode" / "h100"
    prefill = root / "inference_sim" / "mha" / "prefill" / "h100"
    decode.mkdir(parents=True)
    prefill.mkdir(parents=True)
    pd.DataFrame([{"dtype": dtype, "kv_dtype": "bf16", "batch_size": 64, "kv_len": 4096,
                   "latency_us": 377.0}]).to_csv(decode / "32-8-128-tp2.csv", index=False)
    pd.DataFrame([{"dtype": "bf16", "seq_len": 8192, "latency_us": 760.0}]).to_csv(
        prefill / "40-40-128.csv", index=False)


def test_inference_sim_attention_heads_from_file_names(tmp_path: Path) -> None:
    _inference_sim_attention(tmp_path)
    (decode,) = load_decode_attention(tmp_path)
    assert decode.attention == AttentionShape(32, 8, 128, 2)
    assert (decode.batch, decode.kv_tokens, decode.time_us) == (64, 4096, 377.0)
    (prefill,) = load_prefill_attention(tmp_path)
    assert prefill.attention == AttentionShape(40, 40, 128, 1)
    assert (prefill.chunk_tokens, prefill.context_tokens, prefill.time_us) == (8192, 0, 760.0)


def test_inference_sim_refuses_other_dtypes(tmp_path: Path) -> None:
    _inference_sim_attention(tmp_path, dtype="fp8")
    with pytest.raises(MeasuredDataError, match="dtype is not bf16"):
        load_decode_attention(tmp_path)


def test_vidur_attention_ms_become_us(tmp_path: Path) -> None:
    folder = tmp_path / "vidur" / "attention" / "a100"
    folder.mkdir(parents=True)
    common = {"n_embd": 8192, "n_q_head": 64, "n_kv_head": 8, "num_tensor_parallel_workers": 2}
    pd.DataFrame([
        {**common, "is_prefill": False, "batch_size": 16, "prefill_chunk_size": 0,
         "kv_cache_size": 1024, "time_stats.attn_decode.median": 0.125,
         "time_stats.attn_prefill.median": math.nan},
        {**common, "is_prefill": True, "batch_size": 1, "prefill_chunk_size": 512,
         "kv_cache_size": 256, "time_stats.attn_decode.median": math.nan,
         "time_stats.attn_prefill.median": 0.75},
    ]).to_csv(folder / "attention.csv", index=False)
    (decode,) = load_decode_attention(tmp_path)
    assert decode.attention == AttentionShape(64, 8, 128, 2)
    assert (decode.device, decode.batch, decode.kv_tokens) == ("a100", 16, 1024)
    assert decode.time_us == pytest.approx(125.0)
    (prefill,) = load_prefill_attention(tmp_path)
    assert (prefill.chunk_tokens, prefill.context_tokens) == (512, 256)
    assert prefill.time_us == pytest.approx(750.0)


def test_cpu_overhead_total_sums_stages(tmp_path: Path) -> None:
    folder = tmp_path / "vidur" / "cpu_overheads" / "a100"
    folder.mkdir(parents=True)
    stages = {"schedule_median": 0.2, "sampler_e2e_median": 0.6,
              "prepare_inputs_e2e_median": 0.8, "process_model_outputs_median": 0.25,
              "ray_comm_time_mean": 0.15}
    pd.DataFrame([{"model_name": "org/m", "batch_size": 8, "tensor_parallel_degree": 1,
                   **stages}]).to_csv(folder / "cpu_overheads.csv", index=False)
    (point,) = load_cpu_overheads(tmp_path)
    assert (point.model, point.batch, point.tp) == ("org/m", 8, 1)
    assert point.total_ms == pytest.approx(2.0)


# ---- the real trimmed tables, where calibration/measured/ holds them
needs_data = pytest.mark.skipif(not (DEFAULT_ROOT / "vidur" / "models.csv").is_file(),
                                reason=MISSING)


@needs_data
def test_shipped_stack_is_layers_times_the_csv_row() -> None:
    path = DEFAULT_ROOT / "vidur" / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    df = pd.read_csv(path)
    raw = df[(df.num_tokens == 1) & (df.num_tensor_parallel_workers == 1)].iloc[0]
    per_layer = sum(raw[f"time_stats.{op}.median"] for op in VIDUR_MS if op != "emb")
    groups = by_fixture(load_vidur_linear_ops())
    row = groups[Fixture("vidur", "h100", "meta-llama/Llama-2-7b-hf", 1)][0]
    assert row.num_tokens == 1 and row.stack_ms == pytest.approx(32 * per_layer)


@needs_data
def test_shipped_sources_agree_on_units() -> None:
    """Same shape, same device, two projects (ms vs ns): stacks within 2x of each other."""
    groups = by_fixture(load_linear_ops())
    lss = groups[Fixture("llmservingsim", "h100", "meta-llama/Llama-3.1-70B", 1)]
    vidur = groups[Fixture("vidur", "h100", "meta-llama/Llama-2-70b-hf", 1)]
    at = {r.num_tokens: r.stack_ms for r in vidur}
    for row in lss:
        if row.num_tokens in at:
            assert 0.5 < row.stack_ms / at[row.num_tokens] < 2.0
