"""The fit: synthetic measurements from a known cost function come back within the noise."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.fit import (
    FEATURES,
    choose_knots,
    fit_measurements,
    fit_table,
    predict_ms,
    raw_features,
)
from calibrate.profile.synthetic import (
    SyntheticCost,
    shape_grid,
    synthetic_measurements,
    verify_shape,
    write_synthetic_table,
)
from sim.cli import main
from sim.config.catalogue import get_model
from sim.core.plan import StepShape
from sim.latency.table import TableLatency, step_features
from sim.latency.table_files import read_measurements, write_measurements
from sim.latency.table_format import FIT_FILE, Measurement, TableError

BUDGET, MAX_SEQS, MAX_CONTEXT = 2048, 256, 4096
GRID = shape_grid(BUDGET, MAX_SEQS, MAX_CONTEXT, verify_query_tokens=(3, 5))
TRUTH = SyntheticCost()


def smooth_truth(shape: StepShape) -> float:
    """Outside the model's family: the linear layers bend smoothly instead of at a knot."""
    rows, pairs, decode_tokens, prefills, decodes = step_features(shape)
    return (1.0 + 5.0 * math.hypot(1.0, rows / 120.0) + 3e-6 * pairs + 1.5e-4 * decode_tokens
            + 0.05 * prefills + 0.02 * decodes)


def fresh_shapes(seed: int, n: int = 600) -> list[StepShape]:
    """Shapes a chunked-prefill scheduler emits, none of them on the measured grid."""
    rng = np.random.default_rng(seed)
    shapes = [verify_shape(int(rng.integers(1, 64)), int(rng.integers(1, MAX_CONTEXT // 2)),
                           int(rng.integers(2, 7))) for _ in range(n // 10)]
    for _ in range(n - len(shapes)):
        prefills = int(rng.integers(0, 4))
        chunks = tuple(int(c) for c in rng.integers(1, BUDGET // 4, prefills))
        contexts = tuple(int(c) for c in rng.integers(0, MAX_CONTEXT // 2, prefills))
        decodes = int(rng.integers(0 if prefills else 1, MAX_SEQS))
        contexts_d = rng.integers(1, MAX_CONTEXT // 2, decodes)
        shapes.append(StepShape(chunks, contexts, decodes, int(contexts_d.sum()),
                                int(contexts_d.max(initial=0)), prefills + decodes))
    return shapes


def ape_pct(model: TableLatency, truth, shapes: list[StepShape]) -> np.ndarray:
    return np.array([abs(model.step_time(s) * 1e3 - truth(s)) / truth(s) * 100
                     for s in shapes])


def test_noise_free_measurements_of_the_family_are_recovered() -> None:
    report = fit_measurements(synthetic_measurements(TRUTH, GRID, noise_cv=0.0))
    errors = ape_pct(TableLatency(report.fit), TRUTH, fresh_shapes(1))
    # exact but for interpolating the bend at 64 tokens between the nearest measured knots
    assert errors.mean() < 0.25 and errors.max() < 1.5
    # the held-out fit has fewer points, so its knots may miss the bend by a little
    assert report.fit.held_out[-1].mean_ape_pct < 1.0
    # the verify term is told apart from the matmul rows its drafts add
    assert report.fit.verify_seq_ms == pytest.approx(TRUTH.verify_seq_ms, rel=0.05)


@pytest.mark.parametrize("truth", [TRUTH, smooth_truth], ids=["family", "smooth"])
@pytest.mark.parametrize("noise_cv", [0.02, 0.05])
def test_noisy_measurements_are_recovered_within_the_noise(truth, noise_cv: float) -> None:
    report = fit_measurements(synthetic_measurements(truth, GRID, noise_cv, seed=3))
    errors = ape_pct(TableLatency(report.fit), truth, fresh_shapes(2))
    noise_pct = noise_cv * 100
    # the fit averages the noise down: its error on fresh shapes is below the noise itself
    assert errors.mean() < 0.45 * noise_pct
    assert np.percentile(errors, 90) < 0.9 * noise_pct
    # held-out points carry their own noise, so their error is about E|noise| = 0.8 cv
    held = report.fit.held_out[-1]
    assert held.kind == "all" and held.points == math.ceil(len(GRID) / 5)
    assert 0.4 * noise_pct < held.mean_ape_pct < 1.3 * noise_pct
    assert held.mean_ape_pct <= held.p90_ape_pct


def test_held_out_split_follows_the_seed() -> None:
    rows = synthetic_measurements(TRUTH, GRID, 0.05, seed=4)
    first, again, other = (fit_measurements(rows, seed=s) for s in (0, 0, 1))
    assert first.fit == again.fit
    assert first.fit.held_out != other.fit.held_out
    # the refit on all points does not depend on the split
    assert first.fit.intercept_ms == pytest.approx(other.fit.intercept_ms)
    assert {e.kind for e in first.fit.held_out} == {"prefill", "decode", "mixed", "verify",
                                                     "all"}


def test_prediction_extrapolates_linearly_past_the_measured_tokens() -> None:
    fit = fit_measurements(synthetic_measurements(TRUTH, GRID, 0.0)).fit
    model = TableLatency(fit)
    last = fit.knots_tokens[-1]
    step = fit.segment_slopes_ms_per_token[-1] / 1e3
    assert model.linear_s(3 * last) - model.linear_s(2 * last) == pytest.approx(step * last)
    assert model.linear_s(0) == model.linear_s(fit.knots_tokens[0])  # flat below the grid
    # and it keeps tracking the (linear) truth out there
    big = StepShape((4 * BUDGET,), (0,))
    assert model.step_time(big) * 1e3 == pytest.approx(TRUTH(big), rel=0.01)


def test_repeated_measurements_of_a_grid_average_their_noise_down() -> None:
    """Eight noisy measurements of every shape (~1000 rows): the fit's error on fresh shapes
    falls well below one measurement's noise, and below the error of a fit on one each."""
    once = fit_measurements(synthetic_measurements(TRUTH, GRID, 0.03, seed=5))
    eight = fit_measurements(synthetic_measurements(TRUTH, GRID * 8, 0.03, seed=5))
    assert eight.fit.fitted_points == 8 * len(GRID)
    shapes = fresh_shapes(6)
    errors_once = ape_pct(TableLatency(once.fit), TRUTH, shapes)
    errors_eight = ape_pct(TableLatency(eight.fit), TRUTH, shapes)
    assert errors_eight.mean() < 0.25 * 3.0
    assert errors_eight.mean() < errors_once.mean()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=2, max_size=300),
       st.integers(2, 30), st.integers(1, 5))
def test_knots_are_measured_increasing_and_populated(rows: list[int], segments: int,
                                                     min_points: int) -> None:
    if len(set(rows)) < 2:
        with pytest.raises(TableError, match="2 or more token counts"):
            choose_knots(np.array(rows), segments, min_points)
        return
    knots = choose_knots(np.array(rows), segments, min_points)
    assert knots[0] == min(rows) and knots[-1] == max(rows)
    assert all(a < b for a, b in zip(knots, knots[1:], strict=False))
    assert set(knots) <= set(rows)
    if len(knots) > 2:
        for low, high in zip(knots, knots[1:], strict=False):
            assert sum(low < r <= high for r in rows) >= min_points


def test_design_matrix_and_step_time_agree() -> None:
    rows = synthetic_measurements(TRUTH, GRID, 0.03, seed=6)
    assert {m.decode_query_tokens for m in rows if m.kind == "verify"} == {3, 5}
    assert all(m.shape == shape for m, (_, shape) in zip(rows, GRID, strict=True))
    fit = fit_measurements(rows).fit
    model = TableLatency(fit)
    predicted = predict_ms(fit, raw_features(rows))
    assert [model.step_time(m.shape) * 1e3 for m in rows] == pytest.approx(predicted.tolist())


def test_bad_inputs_are_refused_with_the_reason() -> None:
    rows = synthetic_measurements(TRUTH, GRID, 0.03)
    with pytest.raises(TableError, match="at least 10 measurements"):
        fit_measurements(rows[:5])
    with pytest.raises(TableError, match="2 or more token counts"):
        fit_measurements([Measurement("decode", num_decodes=8, decode_context_sum=8 * i,
                                      padded_batch=8, wall_ms_median=1.0 + i)
                          for i in range(12)])
    no_device = [Measurement("decode", num_decodes=i, padded_batch=i, wall_ms_median=1.0 + i)
                 for i in range(1, 13)]
    with pytest.raises(TableError, match="no device_ms_median"):
        fit_measurements(no_device, timing="device")
    with pytest.raises(TableError, match="holdout_every"):
        fit_measurements(rows, holdout_every=1)


def test_fit_table_writes_fit_json(tmp_path: Path) -> None:
    directory = write_synthetic_table(tmp_path / "t", get_model("tiny"), noise_cv=0.03)
    report = fit_table(directory, timing="device")
    body = json.loads((directory / FIT_FILE).read_text())
    assert body["format_version"] == 1 and body["timing"] == "device"
    assert body["features"] == FEATURES
    assert body["knots_tokens"] == list(report.fit.knots_tokens)
    assert body["fitted_points"] == len(read_measurements(directory))
    assert [e["kind"] for e in body["held_out"]][-1] == "all"


def test_cli_fit_prints_the_held_out_table(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    directory = write_synthetic_table(tmp_path / "t", get_model("tiny"), noise_cv=0.03)
    assert main(["calibrate", "fit", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "held out" in out and "mean APE" in out and "p90 APE" in out
    for kind in ("prefill", "decode", "mixed", "all"):
        assert f"\n{kind} " in out
    assert (directory / FIT_FILE).is_file()


def test_cli_fit_user_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "fit", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no such calibration table directory" in err and "Traceback" not in err
    spec = get_model("tiny")
    directory = write_synthetic_table(tmp_path / "t", spec)
    rows = [Measurement("decode", num_decodes=i, padded_batch=i, wall_ms_median=1.0 + i)
            for i in range(1, 13)]
    write_measurements(directory, rows, _metadata_of(directory))
    assert main(["calibrate", "fit", str(directory), "--timing", "device"]) == 2
    assert "device_ms_median" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "fit", str(directory), "--timing", "gpu"])
    assert info.value.code == 2


def _metadata_of(directory: Path):
    from sim.latency.table_files import read_metadata

    return read_metadata(directory)
