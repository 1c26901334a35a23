"""Fit engine step measurements to the `table` latency model, and report held-out error.

The model (see sim.latency.table) follows Vidur and vLLM practice: linear-layer
time is a function of the step's token rows alone, interpolated over a grid
of token counts; attention is split into prefill (query-key pairs: chunk x
(context + chunk / 2), causal within the chunk) and decode (KV tokens read:
decode context sum x query tokens); per-sequence and per-step overheads
close the gap to wall time. Every term is linear in its coefficient, so the
fit is one non-negative least squares (scipy's nnls) over a design matrix:

- non-negative slopes between knots make the linear-layer curve monotone,
  flat where the GPU is memory-bound and rising where it is compute-bound;
- rows are weighted by 1 / measured time, so the fit minimises relative
  error and a 2 ms decode counts as much as a 400 ms prefill;
- knots sit at measured token counts, geometrically spaced (at most
  `max_segments`), each segment holding at least `min_points` measurements.

Held-out error: a seeded shuffle puts every `holdout_every`-th measurement
aside, the model is fitted on the rest and scored on those (mean and p90
absolute percentage error, per kind); then it is refitted on all points,
and that refit is what fit.json holds. Fitting takes milliseconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from sim.latency.table import (
    ErrorStats,
    TableFit,
    decode_padded_tokens,
    ramp_basis,
    starts_from_idle,
    step_features,
)
from sim.latency.table_files import measurements_sha256, read_measurements, read_metadata, write_fit
from sim.latency.table_format import KINDS, Measurement, TableError

FEATURES = {
    "rows": "token rows the matmuls run over: prefill tokens + decodes x decode_query_tokens "
            "(1 + speculative tokens) + padded slots (padded_batch - sequences)",
    "linear_ms(rows)": "intercept_ms + piecewise-linear interpolation over knots_tokens with "
                       "segment_slopes_ms_per_token (>= 0: monotone); flat below the first "
                       "knot, the last slope continues past the last knot",
    "prefill_attention_ms_per_pair": "x sum over prefill chunks of chunk * (context + chunk/2)",
    "decode_attention_ms_per_token": "x decode_context_sum * decode_query_tokens (in a "
                                     "StepShape: decode_context_sum + mean k x "
                                     "spec_context_sum)",
    "prefill_seq_ms": "x number of prefill chunks (sequences)",
    "decode_seq_ms": "x number of decoding sequences",
    "decode_padded_attention_ms_per_token": "x number of decodes x the step's widest sequence "
                                            "(decode attention padded to the widest table)",
    "idle_start_ms": "x 1 for a prefill-only step (nothing else running: the first step "
                     "after an idle wait)",
    "verify_seq_ms": "x number of decodes verifying drafts (num_spec_decodes)",
}
MIN_MEASUREMENTS = 10


@dataclass(frozen=True, slots=True)
class FitReport:
    """The refit on all points, with its held-out and in-sample errors."""

    fit: TableFit
    in_sample: tuple[ErrorStats, ...]
    held_out_points: int
    holdout_every: int
    seed: int


def choose_knots(rows: np.ndarray, max_segments: int = 24, min_points: int = 3
                 ) -> tuple[int, ...]:
    """Measured token counts, roughly geometric, with `min_points` rows in every segment."""
    values = np.sort(np.asarray(rows, dtype=np.int64))
    distinct = np.unique(values)
    if len(distinct) < 2:
        raise TableError(f"need measurements at 2 or more token counts to fit the linear "
                         f"layers, got only {distinct.tolist()}")
    ratio = max(1.25, float(distinct[-1] / max(distinct[0], 1)) ** (1 / max_segments))

    def points_between(low: int, high: int) -> int:
        return int(np.searchsorted(values, high, "right") - np.searchsorted(values, low, "right"))

    knots = [int(distinct[0])]
    for t in distinct[1:-1]:
        if t >= knots[-1] * ratio and points_between(knots[-1], t) >= min_points:
            knots.append(int(t))
    last = int(distinct[-1])
    if len(knots) > 1 and points_between(knots[-1], last) < min_points:
        knots[-1] = last  # too few points past the last knot: stretch that segment instead
    else:
        knots.append(last)
    return tuple(knots)


def raw_features(measurements: Sequence[Measurement]) -> np.ndarray:
    """One row per measurement: step_features of its shape (query tokens included), then
    its padded decode attention tokens, idle start and verifying sequences."""
    return np.array([(*step_features(m.shape), decode_padded_tokens(m.shape),
                      starts_from_idle(m.shape), m.shape.num_spec_decodes)
                     for m in measurements], dtype=np.float64).reshape(len(measurements), 8)


def design_matrix(features: np.ndarray, knots: tuple[int, ...]) -> np.ndarray:
    """Columns: intercept, one ramp per knot segment, then the other features."""
    ones = np.ones((len(features), 1))
    return np.hstack([ones, ramp_basis(features[:, 0], knots), features[:, 1:]])


def _solve(design: np.ndarray, measured_ms: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising relative squared error."""
    weighted = design / measured_ms[:, None]
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0  # a feature absent from every row: its coefficient stays 0
    solution, _ = nnls(weighted / scale, np.ones(len(measured_ms)), maxiter=50 * design.shape[1])
    return solution / scale


def _to_fit(x: np.ndarray, knots: tuple[int, ...], timing: str) -> TableFit:
    k = len(knots) - 1
    return TableFit(timing, knots, float(x[0]), tuple(float(v) for v in x[1:1 + k]),
                    *(float(v) for v in x[1 + k:]))


def fit_arrays(features: np.ndarray, measured_ms: np.ndarray, timing: str) -> TableFit:
    knots = choose_knots(features[:, 0])
    return _to_fit(_solve(design_matrix(features, knots), measured_ms), knots, timing)


def predict_ms(fit: TableFit, features: np.ndarray) -> np.ndarray:
    x = np.array([fit.intercept_ms, *fit.segment_slopes_ms_per_token,
                  *fit.other_coefficients_ms, fit.decode_padded_attention_ms_per_token,
                  fit.idle_start_ms, fit.verify_seq_ms])
    design = design_matrix(features, fit.knots_tokens)
    return design @ x[:design.shape[1]]  # features without the padded column: its term is 0


def error_stats(kinds: Sequence[str], predicted_ms: np.ndarray, measured_ms: np.ndarray
                ) -> tuple[ErrorStats, ...]:
    """Mean and p90 absolute percentage error per kind present, then over all."""
    ape = np.abs(predicted_ms - measured_ms) / measured_ms * 100.0
    labels = np.asarray(kinds)
    groups = [(k, labels == k) for k in KINDS if (labels == k).any()]
    groups.append(("all", np.ones(len(ape), dtype=bool)))
    return tuple(ErrorStats(k, int(mask.sum()), float(ape[mask].mean()),
                            float(np.percentile(ape[mask], 90))) for k, mask in groups)


def fit_measurements(measurements: Sequence[Measurement], timing: str = "wall",
                     holdout_every: int = 5, seed: int = 0, sha256: str = "") -> FitReport:
    """Held-out score of a fit on all but every `holdout_every`-th point, then the full refit."""
    if holdout_every < 2:
        raise TableError(f"holdout_every must be >= 2, got {holdout_every}")
    if len(measurements) < MIN_MEASUREMENTS:
        raise TableError(f"need at least {MIN_MEASUREMENTS} measurements to fit and hold "
                         f"some out, got {len(measurements)}")
    measured = np.array([m.median_ms(timing) for m in measurements])
    if np.isnan(measured).any():
        raise TableError(f"{int(np.isnan(measured).sum())} measurements have no "
                         f"{timing}_ms_median; fit another timing (--timing wall|device)")
    features, kinds = raw_features(measurements), [m.kind for m in measurements]
    held = np.zeros(len(measurements), dtype=bool)
    held[np.random.default_rng(seed).permutation(len(measurements))[::holdout_every]] = True
    partial = fit_arrays(features[~held], measured[~held], timing)
    held_out = error_stats([k for k, h in zip(kinds, held, strict=True) if h],
                           predict_ms(partial, features[held]), measured[held])
    fit = dataclasses.replace(fit_arrays(features, measured, timing), measurements_sha256=sha256,
                              fitted_points=len(measurements), held_out=held_out)
    in_sample = error_stats(kinds, predict_ms(fit, features), measured)
    return FitReport(fit, in_sample, int(held.sum()), holdout_every, seed)


def fit_table(directory: str | Path, timing: str | None = None, holdout_every: int = 5,
              seed: int = 0, out: str | Path | None = None) -> FitReport:
    """Fit DIR's measurements (timing: metadata's unless given) and write DIR/fit.json
    (`out`/fit.json instead when given: the CLI stages the file, then adds it to DIR)."""
    metadata = read_metadata(directory)
    measurements = read_measurements(directory)
    report = fit_measurements(measurements, timing or metadata.timing, holdout_every, seed,
                              measurements_sha256(directory))
    write_fit(directory if out is None else out, report.fit, FEATURES)
    return report


def format_report(report: FitReport) -> str:
    """The held-out error table and the coefficients, for the terminal."""
    fit = report.fit
    lines = [f"{fit.timing} time, {fit.fitted_points} measurements; held out "
             f"{report.held_out_points} (1 in {report.holdout_every}, after a shuffle with "
             f"seed {report.seed}), scored a fit on the rest, then refitted on all",
             f"{'kind':<9}{'held-out':>9}{'mean APE':>10}{'p90 APE':>9}"
             f"{'in-sample mean':>16}{'p90':>7}"]
    in_sample = {e.kind: e for e in report.in_sample}
    for e in fit.held_out:
        mine = in_sample[e.kind]
        lines.append(f"{e.kind:<9}{e.points:>9}{e.mean_ape_pct:>9.2f}%{e.p90_ape_pct:>8.2f}%"
                     f"{mine.mean_ape_pct:>15.2f}%{mine.p90_ape_pct:>6.2f}%")
    slopes = " ".join(f"{s * 1e3:.3g}" for s in fit.segment_slopes_ms_per_token)
    lines += [f"step overhead {fit.intercept_ms:.4g} ms; per prefill seq "
              f"{fit.prefill_seq_ms:.4g} ms; per decode seq {fit.decode_seq_ms:.4g} ms",
              f"prefill attention {fit.prefill_attention_ms_per_pair * 1e6:.4g} ns/pair; "
              f"decode attention {fit.decode_attention_ms_per_token * 1e6:.4g} ns/KV token, "
              f"padded {fit.decode_padded_attention_ms_per_token * 1e6:.4g} ns/token; "
              f"first step after idle +{fit.idle_start_ms:.4g} ms; per verifying seq "
              f"{fit.verify_seq_ms:.4g} ms",
              f"linear layers: knots (tokens) {' '.join(map(str, fit.knots_tokens))}",
              f"  slopes (us/token) {slopes}"]
    return "\n".join(lines)
