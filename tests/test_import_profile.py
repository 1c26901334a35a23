"""`servesim calibrate import`: a published profile, in its own format, becomes a table.

The profiles are built here, tiny and synthetic, in exactly the published
layouts (Vidur's mlp.csv / attention.csv columns, LLMServingSim's long
layers.csv), so these tests need none of the fetched data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from calibrate.published.profiles import Curve
from sim.cli import main
from sim.config.catalogue import get_model
from sim.config.scenario import Scenario
from sim.core.plan import StepShape
from sim.experiments.run import run_scenario
from sim.latency.table import TableLatency
from sim.latency.table_files import open_table_latency, read_metadata

TINY = get_model("tiny")
_VIDUR_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
              "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def layer_ms(tokens: float) -> float:
    """The synthetic profile's per-layer linear ops: flat, then linear (ms)."""
    return 0.05 + 0.001 * max(0.0, tokens - 64)


def write_vidur(directory: Path, tp: int = 1) -> Path:
    """mlp.csv and attention.csv with Vidur's published columns (all five stats per op)."""
    directory.mkdir(parents=True)
    rows = []
    for n in TOKENS:
        row = {"n_head": TINY.num_heads, "n_kv_head": TINY.num_kv_heads,
               "n_embd": TINY.hidden_size, "n_expanded_embd": TINY.intermediate_size,
               "vocab_size": TINY.vocab_size, "use_gated_mlp": True, "num_tokens": n,
               "num_tensor_parallel_workers": tp}
        for op in _VIDUR_OPS:
            ms = 0.01 if op == "emb" else layer_ms(n) / (len(_VIDUR_OPS) - 1)
            for stat in ("min", "max", "mean", "median", "std"):
                row[f"time_stats.{op}.{stat}"] = 0.0 if stat == "std" else ms
        rows.append(row)
    pd.DataFrame(rows).to_csv(directory / "mlp.csv", index=False)
    att = []
    for batch in (1, 2, 4, 8, 16, 32, 64):
        for kv in (32, 256, 1024, 2048):
            att.append({"n_embd": TINY.hidden_size, "n_q_head": TINY.num_heads,
                        "n_kv_head": TINY.num_kv_heads, "num_tensor_parallel_workers": tp,
                        "is_prefill": False, "batch_size": batch, "prefill_chunk_size": 0,
                        "kv_cache_size": kv, "time_stats.attn_decode.median": 1e-5 * batch * kv,
                        "time_stats.attn_prefill.median": None})
    for chunk in (64, 128, 512, 1024):
        for kv in (0, 512, 1024):
            att.append({"n_embd": TINY.hidden_size, "n_q_head": TINY.num_heads,
                        "n_kv_head": TINY.num_kv_heads, "num_tensor_parallel_workers": tp,
                        "is_prefill": True, "batch_size": 1, "prefill_chunk_size": chunk,
                        "kv_cache_size": kv, "time_stats.attn_decode.median": None,
                        "time_stats.attn_prefill.median": 1e-6 * chunk * (kv + chunk)})
    pd.DataFrame(att).to_csv(directory / "attention.csv", index=False)
    return directory


def write_llmservingsim(directory: Path) -> Path:
    """layers.csv in LLMServingSim's long format (one row per layer and token count, ns)."""
    directory.mkdir(parents=True)
    names = ("embedding", "input_layernorm", "q_proj", "k_proj", "v_proj", "rope", "attn",
             "o_proj", "post_layernorm", "gate_proj", "up_proj", "act_fn", "down_proj",
             "final_layernorm", "lm_head")
    rows = [{"layer_name": name, "input": n, "kv_cache": 0, "tp_size": 1,
             "latency(ns)": int(layer_ms(n) / 11 * 1e6) if name not in (
                 "embedding", "attn", "final_layernorm", "lm_head") else 20_000}
            for n in TOKENS for name in names]
    pd.DataFrame(rows).to_csv(directory / "layers.csv", index=False)
    return directory


def borrowed_line(said: str) -> str:
    return next(line for line in said.splitlines() if line.startswith("from the roofline"))


def import_args(source: str, profile: Path, out: Path, *extra: str) -> list[str]:
    return ["calibrate", "import", source, str(profile), "--model", "tiny", "--gpu",
            "a100-80gb", "--out", str(out), "--max-num-batched-tokens", "1024",
            "--max-num-seqs", "32", "--commit", "0123abc", *extra]


def test_curve_interpolates_and_extends_the_last_slope() -> None:
    curve = Curve((1.0, 2.0, 4.0), (1.0, 2.0, 3.0))
    assert curve(3.0) == pytest.approx(2.5)
    assert curve(8.0) == pytest.approx(5.0)
    assert curve(0.5) == pytest.approx(1.0)


def test_vidur_profile_imports_with_provenance_and_roofline_parts_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_vidur(tmp_path / "compute" / "a100" / "org" / "tiny")
    out = tmp_path / "table"
    assert main(import_args("vidur", profile, out)) == 0
    said = borrowed_line(capsys.readouterr().out)
    assert "lm_head and sampling" in said and "CPU overhead (per step, per sequence)" in said
    assert "attention" not in said  # attention.csv was beside mlp.csv
    meta = read_metadata(out)
    provenance = dict(meta.provenance)
    assert provenance["repository"] == "https://github.com/microsoft/vidur"
    assert provenance["commit"] == "0123abc"
    assert "lm_head and sampling" in provenance["from the roofline"]
    assert "sha256" in provenance["file mlp.csv"] and "sha256" in provenance["file attention.csv"]
    assert meta.timing == "device" and meta.cpu_step_ms > 0 and meta.cpu_seq_ms > 0
    raw = json.loads((out / "metadata.json").read_text())
    assert raw["provenance"]["source"] == "vidur"
    # the table predicts the profile's layers: a 512-token prefill is ~2 x layer_ms(512) more
    # than a 64-token one (the roofline's lm_head and the CPU terms cancel in the difference)
    latency = open_table_latency(out, TINY, 16)
    long, short = (latency.step_time(StepShape((n,), (0,))) for n in (512, 64))
    layers = TINY.num_layers * (layer_ms(512) - layer_ms(64))
    attention = TINY.num_layers * 1e-6 * (512 * 512 - 64 * 64)
    assert (long - short) * 1e3 == pytest.approx(layers + attention, rel=0.1)


def test_missing_attention_comes_from_the_roofline(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_vidur(tmp_path / "p")
    (profile / "attention.csv").unlink()
    assert main(import_args("vidur", profile, tmp_path / "t")) == 0
    said = borrowed_line(capsys.readouterr().out)
    assert "decode attention" in said and "prefill attention" in said
    assert "decode attention" in dict(read_metadata(tmp_path / "t").provenance)[
        "from the roofline"]


def test_llmservingsim_profile_keeps_its_lm_head(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_llmservingsim(tmp_path / "H100" / "org" / "tiny" / "tp1")
    assert main(import_args("llmservingsim", profile, tmp_path / "t")) == 0
    said = borrowed_line(capsys.readouterr().out)
    assert "lm_head and sampling" not in said and "sampling" in said
    assert dict(read_metadata(tmp_path / "t").provenance)["repository"].endswith("LLMServingSim")


@pytest.mark.parametrize(("edit", "message"), [
    ({"n_embd": 128}, "n_embd is [128], the model --model names has 64"),
    ({"num_tensor_parallel_workers": 2}, "no rows at num_tensor_parallel_workers 1"),
])
def test_a_profile_of_another_model_is_refused(tmp_path: Path, edit: dict, message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_vidur(tmp_path / "p")
    df = pd.read_csv(profile / "mlp.csv")
    for column, value in edit.items():
        df[column] = value
    df.to_csv(profile / "mlp.csv", index=False)
    assert main(import_args("vidur", profile, tmp_path / "t")) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("field", ["weight_dtype", "expert_dtype", "kv_dtype"])
def test_a_quantised_model_is_refused(tmp_path: Path, field: str) -> None:
    """The profiles time bf16 kernels: a table claiming fp8 weights or KV would lie."""
    import dataclasses

    from calibrate.published.import_profile import import_profile
    from sim.config.catalogue import get_hardware
    from sim.latency.table_format import TableError

    spec = dataclasses.replace(TINY, **{field: "fp8"})
    with pytest.raises(TableError, match=f"model_spec.{field} is 'fp8': the published"):
        import_profile("vidur", write_vidur(tmp_path / "p"), spec, get_hardware("a100-80gb"),
                       tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_missing_profile_file_is_one_message(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(import_args("vidur", tmp_path / "empty", tmp_path / "t")) == 2
    assert "mlp.csv: missing" in capsys.readouterr().err


def scenario_on(table: Path, **latency: object) -> Scenario:
    return Scenario.model_validate({
        "model": "tiny", "hardware": {"gpu": "a100-80gb"}, "seed": 1,
        "latency": {"model": "table", "path": table.name, **latency},
        "kv": {"num_blocks": 4000},
        "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 1024},
        "workload": {"arrivals": {"process": "poisson", "rate": 20},
                     "prompt_tokens": {"dist": "uniform", "low": 16, "high": 600},
                     "output_tokens": {"dist": "uniform", "low": 4, "high": 60},
                     "num_requests": 60}})


def test_a_scenario_runs_end_to_end_on_an_imported_table(tmp_path: Path) -> None:
    profile = write_vidur(tmp_path / "p")
    table = tmp_path / "imported"
    assert main(import_args("vidur", profile, table)) == 0
    base = run_scenario(scenario_on(table), tmp_path, show_progress=False).summary
    assert base["completed"] == 60
    assert base["latency_model"] == "table(imported, a100-80gb)"
    # the table's CPU terms are overridable per scenario: 10 ms more a step shows in TPOT
    slow = run_scenario(scenario_on(table, step_overhead_ms=read_metadata(table).cpu_step_ms
                                    + 10.0), tmp_path, show_progress=False).summary
    assert slow["median_tpot_ms"] > base["median_tpot_ms"] + 9


def test_table_step_overhead_adds_to_every_step(tmp_path: Path) -> None:
    profile = write_vidur(tmp_path / "p")
    assert main(import_args("vidur", profile, tmp_path / "t")) == 0
    shape = StepShape(num_decodes=4, decode_context_sum=400, decode_context_max=100,
                      padded_batch=4)
    free = open_table_latency(tmp_path / "t", TINY, 16, cpu_step_ms=0.0, cpu_seq_ms=0.0)
    dear = open_table_latency(tmp_path / "t", TINY, 16, cpu_step_ms=3.0, cpu_seq_ms=0.5)
    assert isinstance(dear, TableLatency)
    assert dear.step_time(shape) - free.step_time(shape) == pytest.approx(5e-3)
    assert dear.step_time(StepShape()) == 0.0  # nothing runs, nothing is paid


@pytest.mark.parametrize(("value", "message"), [
    (-1.0, "latency.step_overhead_ms: Input should be greater than or equal to 0"),
    ("inf", "latency.step_overhead_ms: Input should be a finite number"),
])
def test_bad_table_step_overhead_is_one_message(tmp_path: Path, value: object, message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_vidur(tmp_path / "p")
    assert main(import_args("vidur", profile, tmp_path / "t")) == 0
    raw = scenario_on(tmp_path / "t").model_dump(mode="json", exclude_defaults=True)
    raw["output"] = {"plots": False, "dir": str(tmp_path / "out")}
    raw["latency"]["step_overhead_ms"] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_attention_outside_the_measured_grid_scales_as_the_roofline(tmp_path: Path) -> None:
    """Past the table's longest KV, decode attention is its edge scaled by the roofline's
    growth, not the edge itself."""
    from calibrate.published.import_profile import ComposedStep
    from calibrate.published.profiles import read_vidur
    from sim.config.catalogue import get_hardware
    from sim.latency.roofline import RooflineLatency

    profile = read_vidur(write_vidur(tmp_path / "p"), TINY, 1, None, None)
    roofline = RooflineLatency(TINY, get_hardware("a100-80gb"))
    composed = ComposedStep(profile, roofline, TINY.num_layers)

    def decode(batch: int, context: int) -> StepShape:
        return StepShape(num_decodes=batch, decode_context_sum=batch * context,
                         decode_context_max=context, padded_batch=batch)

    def roof_attention(shape: StepShape) -> float:
        return roofline.breakdown(shape)["attention_s"]

    # the grid's KV ends at 2048; far enough past it that the roofline outgrows its minimum
    edge, beyond = decode(8, 2047), decode(8, 65535)
    grown = composed.device_ms(beyond) - composed.device_ms(edge)
    measured_edge_ms = TINY.num_layers * 1e-5 * 8 * 2048
    expected = measured_edge_ms * (roof_attention(beyond) / roof_attention(edge) - 1)
    other = (roofline.breakdown(beyond)["allreduce_s"] - roofline.breakdown(edge)["allreduce_s"])
    assert grown == pytest.approx(expected + other * 1e3, rel=1e-6)
    assert grown > 0  # clamped to the edge it would not have grown at all
