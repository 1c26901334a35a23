"""Calibration tables: the file set, the loader's refusals, and the `table` latency model."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.fit import fit_table
from calibrate.profile.synthetic import SyntheticCost, write_synthetic_table
from sim.assemble import (
    build_block_manager,
    build_latency,
    build_scheduler,
    kv_budget,
    replica_links,
)
from sim.cli import main
from sim.config.catalogue import get_model
from sim.config.costs import kv_bytes_per_token
from sim.config.loader import load_scenario
from sim.config.scenario import Scenario
from sim.config.yaml_input import ScenarioError
from sim.core.decode_run import decode_shape
from sim.core.kv import PagedBlockManager
from sim.core.kv_transfer import swap_move
from sim.core.plan import StepShape
from sim.experiments.run import run_scenario
from sim.latency import LatencyModel, TableLatency, table_files
from sim.latency import table_format as tf
from sim.latency.kv_transfer import step_moves_s
from sim.latency.table import ErrorStats, TableFit
from sim.latency.table_files import (
    load_table,
    open_table_latency,
    read_measurements,
    read_metadata,
    write_measurements,
)
from sim.latency.table_format import (
    FIT_FILE,
    MEASUREMENTS_FILE,
    METADATA_FILE,
    Measurement,
    TableError,
    upgrade_metadata,
)
from sim.results.record.recorder import RunRecorder
from sim.workload import make_requests
from sim.world.fleet import simulate

TINY = get_model("tiny")


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fitted synthetic table for the tiny spec, block size 16."""
    directory = write_synthetic_table(tmp_path_factory.mktemp("tables") / "cpu-tiny", TINY,
                                      noise_cv=0.02, device_name="fake-cpu")
    fit_table(directory)
    return directory


def copy_table(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for name in (METADATA_FILE, MEASUREMENTS_FILE, FIT_FILE):
        (target / name).write_bytes((source / name).read_bytes())
    return target


def edit_metadata(directory: Path, **changes: object) -> None:
    path = directory / METADATA_FILE
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


# -- the file set -------------------------------------------------------------

chunks = st.lists(st.tuples(st.integers(1, 9000), st.integers(0, 9000)), max_size=4)
ms = st.floats(0.001, 1e5, allow_nan=False) | st.just(math.nan)
measurements = st.builds(
    lambda kind, c, d, ctx, pad, q, rep, times: Measurement(
        kind, tuple(x for x, _ in c), tuple(y for _, y in c), d, d * ctx, ctx, pad, q, rep,
        *times),
    st.sampled_from(tf.KINDS), chunks, st.integers(0, 512), st.integers(0, 9000),
    st.integers(0, 600), st.integers(1, 8), st.integers(1, 50), st.tuples(*[ms] * 6))


def same(a: Measurement, b: Measurement) -> bool:
    """Field equality where NaN equals NaN (an unmeasured device column)."""
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True))


@settings(max_examples=40, deadline=None)
@given(st.lists(measurements, min_size=1, max_size=20))
def test_measurements_round_trip(rows: list[Measurement]) -> None:
    meta = tf.TableMetadata("cpu0", "cpu", "2.13.0", None, "float32", TINY, 16, 512, 32)
    with tempfile.TemporaryDirectory() as tmp:
        write_measurements(tmp, rows, meta)
        back = read_measurements(tmp)
        assert read_metadata(tmp) == meta
    assert len(back) == len(rows) and all(same(a, b) for a, b in zip(rows, back, strict=True))


def test_numpy_values_round_trip(tmp_path: Path) -> None:
    """A profiler computing with numpy hands over np.float64/np.int64: the files must still
    read back (repr() once wrote `np.float64(1.25)` into measurements.csv)."""
    row = Measurement("mixed", (np.int64(64),), (np.int64(128),), np.int64(3), np.int64(300),
                      np.int64(120), np.int64(4), np.int64(1), np.int64(5),
                      np.float64(1.25), np.float64(1.0), np.float64(1.5), np.float64(2.25),
                      np.float64(2.0), np.float64(np.nan))
    meta = tf.TableMetadata("cpu0", "cpu", "2.13.0", None, "float32", TINY, 16, 512, 32)
    write_measurements(tmp_path, [row], meta)
    assert "np." not in (tmp_path / MEASUREMENTS_FILE).read_text()
    [back] = read_measurements(tmp_path)
    assert same(row, back) and type(back.wall_ms_median) is float
    fit = TableFit("wall", (0, np.int64(512)), np.float64(0.5), (np.float64(0.01),),
                   np.float32(1e-6), np.float64(2e-4), np.float64(0.02), np.float64(0.03),
                   held_out=(ErrorStats("all", np.int64(7), np.float64(3.5),
                                        np.float64(6.0)),))
    table_files.write_fit(tmp_path, fit, {"intercept_ms": "per step"})
    again = table_files.read_fit(tmp_path)
    assert again.intercept_ms == 0.5 and again.knots_tokens == (0, 512)
    assert again.prefill_attention_ms_per_pair == pytest.approx(1e-6)
    assert again.held_out == (ErrorStats("all", 7, 3.5, 6.0),)


def test_metadata_records_what_produced_the_table(table_dir: Path) -> None:
    raw = json.loads((table_dir / METADATA_FILE).read_text())
    for key in ("format_version", "created", "device_name", "device_kind", "torch_version",
                "cuda_version", "dtype", "model_spec", "block_size", "max_num_batched_tokens",
                "max_num_seqs", "engine_commit", "timing", "notes"):
        assert key in raw
    assert raw["format_version"] == 1 and raw["model_spec"]["hidden_size"] == TINY.hidden_size
    assert read_metadata(table_dir).model_spec == TINY
    # both dtypes are recorded (with the engine's torch dtype beside them)
    assert (raw["model_spec"]["weight_dtype"], raw["model_spec"]["kv_dtype"]) == ("bf16", "bf16")


def test_loader_refuses_another_weight_or_kv_dtype(table_dir: Path) -> None:
    for field, value in (("kv_dtype", "fp8"), ("weight_dtype", "int4")):
        with pytest.raises(TableError, match=f"model_spec.{field}: table 'bf16', scenario"):
            load_table(table_dir, dataclasses.replace(TINY, **{field: value}), 16)


# -- the loader's refusals ----------------------------------------------------

def test_loader_refuses_another_model_spec(table_dir: Path) -> None:
    other = dataclasses.replace(TINY, num_layers=4, hidden_size=128)
    with pytest.raises(TableError) as info:
        load_table(table_dir, other, 16)
    message = str(info.value)
    assert "model_spec.num_layers: table 2, scenario 4" in message
    assert "model_spec.hidden_size: table 64, scenario 128" in message
    assert "intermediate_size" not in message  # only what differs
    renamed = dataclasses.replace(TINY, name="tiny-copy")  # a label, not a shape
    assert load_table(table_dir, renamed, 16).metadata.model_spec == TINY


def test_loader_refuses_another_block_size_and_tp(table_dir: Path) -> None:
    with pytest.raises(TableError, match="block_size: table 16, scenario 32"):
        load_table(table_dir, TINY, 32)
    with pytest.raises(TableError, match="tp: table 1 GPU.*hardware.count 2"):
        open_table_latency(table_dir, TINY, 16, tp=2)


def test_loader_refuses_missing_files(table_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TableError, match="no such calibration table directory"):
        load_table(tmp_path / "absent")
    for name, hint in ((METADATA_FILE, "missing metadata.json"),
                       (MEASUREMENTS_FILE, "missing measurements.csv"),
                       (FIT_FILE, "calibrate fit")):
        broken = copy_table(table_dir, tmp_path / name)
        (broken / name).unlink()
        with pytest.raises(TableError, match=hint):
            load_table(broken, TINY, 16)


def test_loader_refuses_malformed_metadata(table_dir: Path, tmp_path: Path) -> None:
    broken = copy_table(table_dir, tmp_path / "t")
    raw = json.loads((broken / METADATA_FILE).read_text())
    del raw["block_size"]
    raw["colour"] = "blue"
    (broken / METADATA_FILE).write_text(json.dumps(raw))
    with pytest.raises(TableError, match="missing field.*block_size.*unknown field.*colour"):
        load_table(broken)
    edit_metadata(broken, block_size=16, colour=None, device_kind="tpu")
    raw = json.loads((broken / METADATA_FILE).read_text())
    del raw["colour"]
    (broken / METADATA_FILE).write_text(json.dumps(raw))
    with pytest.raises(TableError, match="device_kind must be one of cpu, cuda, got 'tpu'"):
        load_table(broken)


def test_loader_refuses_a_newer_version(table_dir: Path, tmp_path: Path) -> None:
    newer = copy_table(table_dir, tmp_path / "t")
    edit_metadata(newer, format_version=2)
    with pytest.raises(TableError, match="format_version 2 is newer than this servesim reads"):
        load_table(newer, TINY, 16)


def test_an_old_version_is_migrated_or_refused(table_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    old = copy_table(table_dir, tmp_path / "t")
    raw = json.loads((old / METADATA_FILE).read_text())
    # a fabricated version 0 that called the block size "page_tokens"
    raw["page_tokens"] = raw.pop("block_size")
    raw["format_version"] = 0
    (old / METADATA_FILE).write_text(json.dumps(raw))
    with pytest.raises(TableError, match="format_version 0 is older than 1 and cannot be "
                                         "migrated"):
        load_table(old, TINY, 16)

    def rename(meta: dict) -> dict:
        meta["block_size"] = meta.pop("page_tokens")
        return meta

    upgraded = upgrade_metadata(dict(raw), "x", {0: rename})
    assert upgraded["format_version"] == 1 and upgraded["block_size"] == 16
    monkeypatch.setattr(tf, "MIGRATIONS", {0: rename})
    assert load_table(old, TINY, 16).metadata.block_size == 16


def test_loader_refuses_a_fit_of_other_measurements(table_dir: Path, tmp_path: Path) -> None:
    stale = copy_table(table_dir, tmp_path / "t")
    rows = read_measurements(stale)
    write_measurements(stale, rows[:-1], read_metadata(stale))  # a re-profile
    with pytest.raises(TableError, match="fitted to other measurements.*calibrate fit"):
        load_table(stale, TINY, 16)


def test_malformed_measurements_name_line_and_column(table_dir: Path, tmp_path: Path) -> None:
    broken = copy_table(table_dir, tmp_path / "t")
    lines = (broken / MEASUREMENTS_FILE).read_text().splitlines()
    cells = lines[3].split(",")
    cells[3] = "-2"  # num_decodes
    lines[3] = ",".join(cells)
    (broken / MEASUREMENTS_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(TableError, match="line 4: num_decodes must be >= 0, got -2"):
        read_measurements(broken)
    cells[3] = "many"
    lines[3] = ",".join(cells)
    (broken / MEASUREMENTS_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(TableError, match="line 4, column num_decodes: invalid literal"):
        read_measurements(broken)
    (broken / MEASUREMENTS_FILE).write_text("kind,num_decodes\n")
    with pytest.raises(TableError, match="missing column.*prefill_chunk_tokens"):
        read_measurements(broken)


# -- the latency model ---------------------------------------------------------

def test_table_latency_is_a_latency_model_named_after_its_table(table_dir: Path) -> None:
    model = open_table_latency(table_dir, TINY, 16)
    assert isinstance(model, LatencyModel)
    assert model.name == "table(cpu-tiny, fake-cpu)"
    assert model.step_time(StepShape()) == 0.0


def test_a_steps_kv_moves_add_their_link_time(table_dir: Path) -> None:
    """The step's sync KV moves (swaps, sync tier loads) come in priced (moved_s) and are
    added whole; the shape's swap counts alone price nothing (they are counts)."""
    model = open_table_latency(table_dir, TINY, 16)
    shape = StepShape(num_decodes=4, decode_context_sum=400, decode_context_max=100,
                      padded_batch=4)
    swapped = shape._replace(swap_out_tokens=32, swap_in_tokens=16)
    assert model.step_time(swapped) == model.step_time(shape)
    assert model.step_time(swapped, 48e-6) - model.step_time(shape) == pytest.approx(48e-6)
    assert model.step_time(StepShape(swap_in_tokens=10), 1e-5) == 1e-5


def test_speculative_verify_costs_its_query_tokens(table_dir: Path) -> None:
    model = open_table_latency(table_dir, TINY, 16)
    plain = StepShape(num_decodes=8, decode_context_sum=800, decode_context_max=100,
                      padded_batch=8)
    verify = Measurement("verify", num_decodes=8, decode_context_sum=800,
                         decode_context_max=100, padded_batch=8, decode_query_tokens=4).shape
    assert verify.num_spec_tokens == 24 and verify.decode_query_tokens == 4
    # 24 more matmul rows and three more reads of every decode's context
    extra_s = (model.linear_s(32) - model.linear_s(8)
               + 3 * 800 * model.fit.decode_attention_ms_per_token / 1e3)
    assert model.step_time(verify) - model.step_time(plain) == pytest.approx(extra_s)
    assert model.step_time(verify) > model.step_time(plain)


def test_speculative_scenario_runs_on_a_table(table_dir: Path) -> None:
    scenario = small_scenario(table_dir.name, speculative={"num_tokens": 3})
    summary = run_scenario(scenario, table_dir.parent, show_progress=False).summary
    assert summary["latency_model"].startswith("table(cpu-tiny, fake-cpu)")
    assert summary["completed"] == 120 and math.isfinite(summary["mean_tpot_ms"])


shapes = st.builds(
    lambda c, d, ctx, pad, k: StepShape(
        tuple(x for x, _ in c), tuple(y for _, y in c), d, d * ctx, ctx, len(c) + d + pad,
        num_spec_decodes=d if k else 0, num_spec_tokens=d * k, spec_depth=k,
        spec_context_sum=d * ctx if k else 0),
    chunks, st.integers(0, 512), st.integers(0, 9000), st.integers(0, 64), st.integers(0, 5))


@pytest.fixture(scope="module")
def table_model(table_dir: Path) -> TableLatency:
    return open_table_latency(table_dir, TINY, 16)


@settings(max_examples=200, deadline=None)
@given(shapes, st.integers(1, 64), st.integers(1, 2048))
def test_more_work_never_takes_less_time(table_model: TableLatency, shape: StepShape,
                                         more_decodes: int, more_tokens: int) -> None:
    model = table_model
    base = model.step_time(shape)
    assert math.isfinite(base) and base >= 0 and (base > 0) == (shape.batch_size > 0)
    decodes = shape._replace(num_decodes=shape.num_decodes + more_decodes,
                             padded_batch=shape.padded_batch + more_decodes)
    prefill = shape._replace(
        prefill_chunk_tokens=(*shape.prefill_chunk_tokens, more_tokens),
        prefill_context_tokens=(*shape.prefill_context_tokens, 0),
        padded_batch=shape.padded_batch + 1)
    assert model.step_time(decodes) >= base and model.step_time(prefill) >= base
    if shape.num_decodes:
        depth = shape.spec_depth + 1
        deeper = shape._replace(num_spec_decodes=shape.num_decodes,
                                num_spec_tokens=shape.num_decodes * depth, spec_depth=depth,
                                spec_context_sum=shape.decode_context_sum)
        assert model.step_time(deeper) >= base


def small_scenario(table: str, **fields: object) -> Scenario:
    raw = {"model": "tiny", "seed": 3,
           "latency": {"model": "table", "path": table},
           "kv": {"num_blocks": 4000},  # the tiny model would get millions of blocks of an H100
           "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 512},
           "workload": {"arrivals": {"process": "poisson", "rate": 40},
                        "prompt_tokens": {"dist": "uniform", "low": 16, "high": 600},
                        "output_tokens": {"dist": "uniform", "low": 4, "high": 120},
                        "num_requests": 120}}
    return Scenario.model_validate({**raw, **fields})


class Spy:
    """Records every shape the scheduler emits and what the table said."""

    def __init__(self, inner: TableLatency) -> None:
        self.inner, self.name, self.calls = inner, inner.name, []

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        seconds = self.inner.step_time(shape, moved_s)
        self.calls.append((shape, seconds))
        return seconds

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        seconds = self.inner.decode_run_s(shape, steps)
        self.calls += [(decode_shape(shape, s), x) for s, x in enumerate(seconds.tolist())]
        return seconds


@pytest.mark.parametrize("fields", [
    {},
    {"kv": {"num_blocks": 40}, "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 512,
                                             "preemption": "swap"}},
    {"scheduler": {"policy": "static", "batch_size": 8}},
], ids=["continuous", "continuous-swap", "static-padded"])
def test_scheduler_shapes_get_positive_finite_times(table_dir: Path, fields: dict) -> None:
    scenario = small_scenario(table_dir.name, **fields)
    kv = build_block_manager(scenario, kv_budget(scenario))
    latency = build_latency(scenario, table_dir.parent)
    spy = Spy(latency)
    simulate(make_requests(scenario.workload, scenario.seed), build_scheduler(scenario, kv),
             spy, RunRecorder(), links=replica_links(scenario))
    assert len(spy.calls) >= 200
    assert all(math.isfinite(s) and s > 0 for _, s in spy.calls)
    if "preemption" in str(fields):
        assert any(shape.swap_out_tokens for shape, _ in spy.calls)
    if "static" in str(fields):
        assert any(shape.padded_batch > shape.batch_size for shape, _ in spy.calls)


def test_scenario_runs_end_to_end_on_a_table(table_dir: Path, tmp_path: Path) -> None:
    slower = write_synthetic_table(tmp_path / "slow", TINY, noise_cv=0.0,
                                   cost=dataclasses.replace(SyntheticCost(), step_ms=20.0))
    fit_table(slower)
    summaries = {}
    for directory in (table_dir, slower):
        result = run_scenario(small_scenario(directory.name), directory.parent,
                              show_progress=False)
        summaries[directory.name] = result.summary
        assert result.latency_name == result.summary["latency_model"]
    assert summaries["cpu-tiny"]["latency_model"] == "table(cpu-tiny, fake-cpu)"
    assert summaries["slow"]["latency_model"] == "table(slow, synthetic)"
    assert summaries["cpu-tiny"]["completed"] == summaries["slow"]["completed"] == 120
    # an 18.5 ms dearer step shows up in every token's time
    assert summaries["slow"]["mean_tpot_ms"] > summaries["cpu-tiny"]["mean_tpot_ms"] + 15


def test_scenario_path_is_relative_to_the_file(table_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    raw = small_scenario(str(table_dir)).model_dump(mode="json", exclude_defaults=True)
    raw["latency"]["path"] = "cpu-tiny"
    raw["output"] = {"plots": False, "dir": str(tmp_path / "out")}
    path = table_dir.parent / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path)]) == 0
    assert "latency model: table(cpu-tiny, fake-cpu)" in capsys.readouterr().out
    assert main(["run", str(path), "--set", "kv.block_size=32", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "latency.path" in err and "block_size: table 16, scenario 32" in err
    assert "Traceback" not in err
    assert main(["run", str(path), "--set", "latency.path=elsewhere", "--quiet"]) == 2
    assert "no such calibration table directory" in capsys.readouterr().err


@pytest.mark.parametrize(("latency", "message"), [
    ({"model": "table"}, "latency.path: model table needs the calibration table directory"),
    ({"model": "table", "path": "t", "compute_efficiency": 0.5},
     "latency.compute_efficiency: tunes the roofline model only"),
    ({"path": "t"}, "latency.path: only model table reads a table directory"),
    ({"model": "lookup"}, "latency.model: Input should be 'roofline', 'table' or 'fixed'"),
])
def test_scenario_latency_section_is_validated(tmp_path: Path, latency: dict,
                                               message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"latency": latency}))
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_scenario(path)


def test_swap_cost_follows_the_scenario_gpu(table_dir: Path) -> None:
    scenario = small_scenario(table_dir.name)
    """A table prices no swap itself: a swapped block's shard crosses the scenario GPU's
    host link (replica_links), priced as every KV move (step_moves_s -> moved_s)."""
    kv = build_block_manager(scenario, kv_budget(scenario))
    assert isinstance(kv, PagedBlockManager)
    assert kv.block_shard_bytes == kv_bytes_per_token(TINY) * scenario.kv.block_size
    host = replica_links(scenario)["host"]
    assert host == scenario.hardware_spec.host_link
    move = swap_move(0, 3, kv.block_shard_bytes)
    assert step_moves_s({"host": host}, [move]) == pytest.approx(
        host.latency_s + 3 * kv.block_shard_bytes / host.bandwidth_bytes_per_s)


def test_verify_term_prices_each_drafting_sequence(table_dir: Path, tmp_path: Path) -> None:
    """verify_seq_ms is charged once per decode that verifies drafts, on top of the rows and
    attention its drafts add; a fit.json written before the term existed loads it as 0."""
    fit = table_files.read_fit(table_dir)
    with_term = TableLatency(dataclasses.replace(fit, verify_seq_ms=0.5))
    without = TableLatency(dataclasses.replace(fit, verify_seq_ms=0.0))
    plain = StepShape(num_decodes=4, decode_context_sum=400, decode_context_max=100,
                      padded_batch=4)
    verify = plain._replace(num_spec_decodes=3, num_spec_tokens=9, spec_depth=3,
                            spec_context_sum=300)
    assert with_term.step_time(verify) - without.step_time(verify) == pytest.approx(1.5e-3)
    assert with_term.step_time(plain) == without.step_time(plain)
    assert without.step_time(verify) > without.step_time(plain)  # the drafts' rows, attention
    old = copy_table(table_dir, tmp_path / "old")
    raw = json.loads((old / FIT_FILE).read_text())
    del raw["verify_seq_ms"]
    (old / FIT_FILE).write_text(json.dumps(raw))
    assert table_files.read_fit(old).verify_seq_ms == 0.0
