"""Fit the roofline's constants per GPU family on published kernel timings; print the split.

    python -m calibrate.published.fit_roofline [--root calibration/measured]

Needs the fetched tables under calibration/measured/ (see its README: they
are not committed; `calibration/measured/regenerate.py` writes them from
the source projects' checkouts). For each family (ampere = A100, hopper =
H100) it fits, by least squares on log(roofline / measured):

- the GEMM and small-kernel terms (bandwidth and compute efficiency, the
  transition's sharpness, a launch per GEMM, a per-layer small-kernel cost)
  on the linear-op stacks of the TRAIN models, at tp 1 and 2, 1-4,096 rows,
  for every tile shape of TILE_ROWS x TILE_COLS (waves of the family's SM
  count), keeping the shape of the lowest train cost;
- the attention terms on inference-sim's H100 tables (hopper; the only bf16
  attention on record of a current kernel, so ampere takes them too): the
  decode ones on the decode tables, less each table's warm-up row (see
  is_warmup), then the prefill ones on the prefill tables;
- the CPU terms (per step, per sequence) on Vidur's A100 host overheads
  (schedule, sampler, input preparation, output processing; Ray's
  multi-GPU messaging, an artefact of its engine, left out), every model but
  CodeLlama-34B;

then prints train and held-out errors per fixture. CodeLlama-34B on A100 is
never fitted on: the system-level check (docs/roofline.md) replays it. The
printed constants are what sim.latency.roofline_fits.FAMILIES holds. The
roofline's time and error at each published point are in calibrate.published.roofline_errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from calibrate.published.kernels import (
    DecodeAttentionPoint,
    PrefillAttentionPoint,
    load_cpu_overheads,
    load_decode_attention,
    load_prefill_attention,
)
from calibrate.published.measured import (
    DEFAULT_ROOT,
    Fixture,
    LinearOpRow,
    MeasuredDataError,
    by_fixture,
    load_linear_ops,
)
from calibrate.published.roofline_check import ErrorSummary
from calibrate.published.roofline_errors import attention_errors, is_warmup, stack_errors
from sim.latency.roofline_fits import RooflineParams

FAMILY_OF_DEVICE = {"a100": "ampere", "h100": "hopper"}
FIT_TPS = (1, 2)
MAX_ROWS = 4096
# Models whose stacks are fitted on, per device; every other fixture of the device is held out.
TRAIN = {
    "a100": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "Qwen/Qwen-72B",
             "meta-llama/Meta-Llama-3-8B", "microsoft/phi-2"),
    "h100": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "Qwen/Qwen-72B",
             "microsoft/phi-2"),
}
NEVER_FITTED = (("a100", "codellama/CodeLlama-34b-Instruct-hf"),)
# Where every fit starts (the unfitted roofline's efficiencies), so a rerun reproduces the
# committed numbers exactly.
START = RooflineParams("start", bandwidth_efficiency=0.8, compute_efficiency=0.6,
                       transition_sharpness=3.0, gemm_tile_rows=128.0, gemm_tile_cols=128.0,
                       gemm_wave_tiles=1.0, gemm_launch_s=5e-6,
                       layer_small_s=20e-6, attention_bandwidth_efficiency=0.8,
                       attention_compute_efficiency=0.6, decode_attention_launch_s=10e-6,
                       prefill_attention_launch_s=10e-6, attention_min_s=20e-6,
                       cpu_step_s=0.0, cpu_seq_s=0.0, fitted_on="the starting point")
# The GEMM law's discrete constants: each (tile height, tile width) is fitted from each
# start of the transition's sharpness, and the lowest train cost wins. A wave is the
# family's SM count of tiles (datasheet: A100 108, H100 132).
TILE_ROWS = (64.0, 128.0, 256.0)
TILE_COLS = (32.0, 64.0, 128.0)
SHARPNESS_STARTS = (1.5, 3.0, 8.0)
WAVE_TILES = {"ampere": 108.0, "hopper": 132.0}
CPU_STAGES_FITTED = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
                     "process_model_outputs_median")

# (field, low, high) of the vector each least-squares fit moves.
GEMM_FIELDS = (("bandwidth_efficiency", 0.3, 0.95), ("compute_efficiency", 0.3, 1.0),
               ("transition_sharpness", 1.0, 12.0),
               ("gemm_launch_s", 0.0, 30e-6),
               ("layer_small_s", 0.0, 100e-6))
DECODE_FIELDS = (("attention_bandwidth_efficiency", 0.3, 1.0),
                 ("decode_attention_launch_s", 0.0, 60e-6), ("attention_min_s", 0.0, 80e-6))
PREFILL_FIELDS = (("attention_compute_efficiency", 0.2, 1.0),
                  ("prefill_attention_launch_s", 0.0, 60e-6))
ATTENTION_FIELDS = DECODE_FIELDS + PREFILL_FIELDS


def in_range(row: LinearOpRow) -> bool:
    return row.fixture.tp in FIT_TPS and row.num_tokens <= MAX_ROWS


def is_train(fixture: Fixture) -> bool:
    return fixture.model in TRAIN[fixture.device] and (
        (fixture.device, fixture.model) not in NEVER_FITTED)


def _fit(base: RooflineParams, fields: Sequence[tuple[str, float, float]],
         residuals: Callable[[RooflineParams], np.ndarray]) -> RooflineParams:
    """Move `fields` of `base` to minimise the residuals (log ratios), within bounds."""
    def params(x: np.ndarray) -> RooflineParams:
        return dataclasses.replace(base, **{f: float(v) for (f, _, _), v in
                                            zip(fields, x, strict=True)})
    scale = np.array([max(abs(getattr(base, f)), hi * 0.1) for f, _, hi in fields])
    x0 = np.array([getattr(base, f) for f, _, _ in fields]) / scale
    low = np.array([lo for _, lo, _ in fields]) / scale
    high = np.array([hi for _, _, hi in fields]) / scale
    result = least_squares(lambda x: residuals(params(x * scale)), np.clip(x0, low, high),
                           bounds=(low, high))
    return params(result.x * scale)


def _stack_residuals(groups: dict[Fixture, tuple[LinearOpRow, ...]]
                     ) -> Callable[[RooflineParams], np.ndarray]:
    """Log errors; each fixture weighs the same whatever its rows."""
    def residuals(p: RooflineParams) -> np.ndarray:
        return np.concatenate([np.log1p(e) / np.sqrt(len(e))
                               for e in stack_errors(groups, p).values()])
    return residuals


def fit_stacks(base: RooflineParams, groups: dict[Fixture, tuple[LinearOpRow, ...]]
               ) -> RooflineParams:
    """GEMM and small-kernel constants: the continuous ones by least squares for every
    tile shape and start, the tile shape of the lowest cost kept."""
    from tqdm import tqdm

    residuals = _stack_residuals(groups)
    best: tuple[float, RooflineParams] | None = None
    starts = list(itertools.product(TILE_ROWS, TILE_COLS, SHARPNESS_STARTS))
    for rows, cols, sharpness in tqdm(starts, desc=f"{base.family} GEMM fits", leave=False,
                                      file=sys.stderr):
        p = _fit(dataclasses.replace(base, gemm_tile_rows=rows, gemm_tile_cols=cols,
                                     transition_sharpness=sharpness), GEMM_FIELDS, residuals)
        cost = float(np.sum(residuals(p) ** 2))
        if best is None or cost < best[0]:
            best = (cost, p)
    assert best is not None
    return best[1]




def fit_attention(base: RooflineParams, decode: Sequence[DecodeAttentionPoint],
                  prefill: Sequence[PrefillAttentionPoint]) -> RooflineParams:
    """Decode terms on the decode tables (warm-up rows left out), then the prefill ones."""
    kept = [p for p in decode if not is_warmup(p, decode)]
    p = _fit(base, DECODE_FIELDS, lambda q: np.log1p(attention_errors(kept, q)))
    return _fit(p, PREFILL_FIELDS, lambda q: np.log1p(attention_errors(prefill, q)))


def _host_points(root: Path, held_out: bool) -> tuple[np.ndarray, np.ndarray]:
    """(batch, host ms) of the models fitted on, or of the one held out (CodeLlama-34B)."""
    points = [p for p in load_cpu_overheads(root) if ("CodeLlama-34b" in p.model) == held_out]
    return (np.array([p.batch for p in points], dtype=float),
            np.array([sum(ms for s, ms in p.stages_ms if s in CPU_STAGES_FITTED)
                      for p in points]))


def fit_cpu(root: Path) -> tuple[float, float, int]:
    """(per-step s, per-sequence s, points) by least squares over the host stages fitted."""
    batch, host_ms = _host_points(root, held_out=False)
    slope, intercept = np.polyfit(batch, host_ms, 1)
    return float(intercept) / 1e3, float(slope) / 1e3, len(batch)


def cpu_errors(root: Path, step_s: float, seq_s: float, held_out: bool) -> np.ndarray:
    batch, host_ms = _host_points(root, held_out)
    return (step_s + seq_s * batch) * 1e3 / host_ms - 1


def summary_line(label: str, errors: np.ndarray, at: Iterable[int]) -> str:
    s = ErrorSummary.of(list(errors), list(at))
    return (f"{label:<52}{s.n:>6}{s.median * 100:>+8.1f}{s.p95_abs * 100:>8.1f}"
            f"{s.worst * 100:>+8.1f}{s.worst_at:>7}")


def report(groups: dict[Fixture, tuple[LinearOpRow, ...]], params: dict[str, RooflineParams]
           ) -> list[str]:
    lines = [f"{'fixture (linear-op stack, tp 1-2, 1-4096 rows)':<52}{'n':>6}{'median':>8}"
             f"{'p95|e|':>8}{'worst':>8}{'@rows':>7}"]
    for split in ("train", "held-out"):
        lines.append(f"-- {split}")
        for f, rows in groups.items():
            if (split == "train") != is_train(f):
                continue
            e = stack_errors({f: rows}, params[FAMILY_OF_DEVICE[f.device]])[f]
            label = f"{f.source[:5]} {f.device} {f.model.split('/')[-1][:24]} tp{f.tp}"
            lines.append(summary_line(label, e, [r.num_tokens for r in rows]))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help="the measured tables (default: calibration/measured)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except MeasuredDataError as err:
        print(f"error: {err} (calibration/measured/README.md says how to fetch the tables)",
              file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    groups = {f: tuple(r for r in rows if in_range(r)) for f, rows in
              by_fixture(load_linear_ops(args.root)).items() if f.tp in FIT_TPS}
    decode = [p for p in load_decode_attention(args.root) if p.source == "inference_sim"]
    prefill = [p for p in load_prefill_attention(args.root) if p.source == "inference_sim"]
    step_s, seq_s, cpu_points = fit_cpu(args.root)
    hopper_attention = fit_attention(START, decode, prefill)
    fitted: dict[str, RooflineParams] = {}
    for device, family in FAMILY_OF_DEVICE.items():
        train = {f: rows for f, rows in groups.items() if f.device == device and is_train(f)}
        p = fit_stacks(dataclasses.replace(START, family=family,
                                           gemm_wave_tiles=WAVE_TILES[family]), train)
        p = dataclasses.replace(p, **{f: getattr(hopper_attention, f)
                                      for f, _, _ in ATTENTION_FIELDS},
                                cpu_step_s=step_s, cpu_seq_s=seq_s)
        fitted[family] = p
    for line in report(groups, fitted):
        print(line)
    print()
    warm = [p for p in decode if is_warmup(p, decode)]
    for label, points in (("decode", [p for p in decode if p not in warm]),
                          ("decode, warm-up rows (left out)", warm), ("prefill", prefill)):
        e = attention_errors(points, fitted["hopper"])
        x = [p.batch * p.kv_tokens if isinstance(p, DecodeAttentionPoint) else p.chunk_tokens
             for p in points]
        print(summary_line(f"attention {label} inference-sim h100", e, x))
    print(f"\nCPU: {step_s * 1e3:.3f} ms per step + {seq_s * 1e3:.4f} ms per sequence "
          f"({cpu_points} Vidur A100 host points, CodeLlama-34B left out)")
    for held_out in (False, True):
        e = cpu_errors(args.root, step_s, seq_s, held_out)
        print(summary_line(f"CPU overhead, {'held out (CodeLlama-34B)' if held_out else 'train'}",
                           e, list(_host_points(args.root, held_out)[0].astype(int))))
    print()
    print("sim.latency.roofline_fits.FAMILIES (fitted_on aside):")
    for family, p in fitted.items():
        values = ", ".join(f"{f.name}={getattr(p, f.name):.4g}" for f in dataclasses.fields(p)
                           if f.name not in ("family", "fitted_on"))
        print(f"{family}: {values}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
