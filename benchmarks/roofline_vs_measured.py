"""The default (fitted) roofline against published real-GPU kernel timings (calibration/measured/).

For every fixture (source, device, model, tp) it prices the linear-op stack
of 1..4,096 token rows with the default roofline's GEMM and small-kernel
terms (sim.latency.roofline_terms, the family's fit in roofline_fits; no step overhead,
all-reduce, lm_head or attention: what the tables time)
and prints the signed error roofline / measured - 1 (negative: roofline too
fast) with its median, 95th percentile of |error| and worst row; then decode
and prefill attention per layer against inference-sim's H100 tables (and
Vidur's one A100 table), GEMMs, and Vidur's A100 CPU overheads. Plots go to
--out, one pair per device (stack times, stack error), token rows on log x;
the previous, unfitted roofline (one max at 60% / 80% of datasheet) is
drawn dotted beside the default and its median error is a column.

    python benchmarks/roofline_vs_measured.py [--data calibration/measured] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from calibrate.published.fit_roofline import FAMILY_OF_DEVICE
from calibrate.published.kernels import (
    load_cpu_overheads,
    load_decode_attention,
    load_gemms,
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
from calibrate.published.roofline_check import (
    ErrorSummary,
    device_hardware,
    linear_stack_s,
    linear_stack_terms,
)
from calibrate.published.roofline_errors import attention_ms
from calibrate.published.roofline_errors import stack_ms as fitted_stack_ms
from sim.latency.roofline_fits import FAMILIES

MAX_ROWS = 4096
PROBE_ROWS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)
BANDS = (("1-128", 1, 128), ("129-512", 129, 512), ("513-2047", 513, 2047),
         ("2048-4096", 2048, 4096))
REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "roofline_vs_measured"


def stack_errors(rows: tuple[LinearOpRow, ...], previous: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token rows, measured stack ms, roofline stack ms of one fixture's rows <= MAX_ROWS
    (the default roofline, or the previous one)."""
    kept = [r for r in rows if r.num_tokens <= MAX_ROWS]
    device = kept[0].fixture.device
    hw = device_hardware(device)
    tokens = np.array([r.num_tokens for r in kept])
    measured = np.array([r.stack_ms for r in kept])
    if previous:
        roofline = np.array([linear_stack_s(r.shape, r.fixture.tp, r.num_tokens, hw) * 1e3
                             for r in kept])
    else:
        layers = kept[0].shape.num_layers
        roofline = layers * fitted_stack_ms(kept, FAMILIES[FAMILY_OF_DEVICE[device]])
    return tokens, measured, roofline


def _pct(x: float) -> str:
    return f"{100 * x:+6.1f}"


def _name(f: Fixture) -> str:
    return f"{f.source[:5]} {f.device} {f.model.split('/')[-1][:24]:24s} tp{f.tp}"


def print_fixtures(groups: dict[Fixture, tuple[LinearOpRow, ...]]) -> None:
    print("## Fixtures (linear-op stacks)\n")
    print(f"{'fixture':45s} {'rows':>5s} {'tokens':>11s} {'layers':>6s}  shape")
    for f, rows in groups.items():
        s = rows[0].shape
        print(f"{_name(f):45s} {len(rows):5d} {rows[0].num_tokens:>5d}-{rows[-1].num_tokens:<5d}"
              f" {s.num_layers:6d}  h{s.hidden} q{s.heads} kv{s.kv_heads} d{s.head_dim} "
              f"i{s.intermediate} v{s.vocab}{'' if s.gated else ' ungated'}")
    print()


def _efficiency(rows: tuple[LinearOpRow, ...]) -> tuple[float, float, float]:
    """Small-kernel µs per layer at 1 row; GEMM HBM fraction at 1 row; compute at 4096."""
    first, last = rows[0], max(rows, key=lambda r: r.num_tokens)
    hw = device_hardware(first.fixture.device)
    tp = first.fixture.tp
    _, weight_bytes = linear_stack_terms(first.shape, tp, 0)
    per_layer_bytes = weight_bytes / first.shape.num_layers
    bw = per_layer_bytes / (first.gemm_ms * 1e-3) / hw.memory_bandwidth_bytes_per_s
    flops, _ = linear_stack_terms(last.shape, tp, last.num_tokens)
    per_layer_flops = flops / last.shape.num_layers
    compute = per_layer_flops / (last.gemm_ms * 1e-3) / hw.bf16_flops_per_s
    return first.small_ms * 1e3, bw, compute


def print_stack_table(groups: dict[Fixture, tuple[LinearOpRow, ...]]) -> dict:
    print("## Linear-op stack: roofline / measured - 1, % (negative = roofline too fast)\n")
    probes = " ".join(f"{t:>6d}" for t in PROBE_ROWS)
    print(f"{'fixture':45s} {'n':>4s} {'median':>6s} {'p95|e|':>6s} {'worst':>6s} {'@rows':>5s}"
          f" | {probes} | small_us bw@1 fl@4k prev_median")
    band_errors: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    summaries = {}
    for f, rows in groups.items():
        tokens, measured, roofline = stack_errors(rows)
        err = roofline / measured - 1
        summary = ErrorSummary.of(err, tokens)
        summaries[f] = summary
        at = {int(t): e for t, e in zip(tokens, err, strict=True)}
        cells = " ".join(_pct(at[t]) if t in at else "     -" for t in PROBE_ROWS)
        small_us, bw, compute = _efficiency(tuple(r for r in rows if r.num_tokens <= MAX_ROWS))
        _, _, before = stack_errors(rows, previous=True)
        print(f"{_name(f):45s} {summary.n:4d} {_pct(summary.median)} "
              f"{100 * summary.p95_abs:6.1f} {_pct(summary.worst)} {summary.worst_at:5d} | "
              f"{cells} | {small_us:8.1f} {bw:5.2f} {compute:5.2f} "
              f"{_pct(np.median(before / measured - 1))}")
        tps = "tp1-2" if f.tp <= 2 else "tp4-8"
        for i, (_, lo, hi) in enumerate(BANDS):
            band_errors[(f.device, f.source, tps, i)] += list(err[(tokens >= lo) & (tokens <= hi)])
    passing = [f for f, s in summaries.items() if abs(s.median) <= 0.10
               and s.p95_abs <= 0.15 and abs(s.worst) <= 0.30]
    print(f"\nwithin the issue's bounds (|median| <= 10%, p95 |e| <= 15%, worst <= 30%): "
          f"{len(passing)} of {len(summaries)} fixtures")
    print("small_us: norms+rope+act+add per layer at 1 row (µs); bw@1: GEMM weight bytes / "
          "time / datasheet HBM at 1 row; fl@4k: GEMM FLOPs / time / datasheet bf16 at the "
          "largest row count <= 4096; prev_median: the previous roofline's median error.\n")
    print("## By token-row band, all fixtures of a device, source and tp range\n")
    print(f"{'device':6s} {'source':14s} {'tp':5s} {'rows':10s} {'n':>5s} {'median':>6s} "
          f"{'p95|e|':>6s} {'min':>6s} {'max':>6s}")
    for (device, source, tps, i), errs in sorted(band_errors.items()):
        if not errs:
            continue
        e = np.array(errs)
        print(f"{device:6s} {source:14s} {tps:5s} {BANDS[i][0]:10s} {e.size:5d} "
              f"{_pct(np.median(e))} {100 * np.percentile(np.abs(e), 95):6.1f} "
              f"{_pct(e.min())} {_pct(e.max())}")
    print()
    return summaries


def print_attention(root: Path) -> None:
    print("## Attention per layer: default roofline / measured - 1, %\n")
    groups: dict[tuple, list] = defaultdict(list)
    for p in load_decode_attention(root):
        groups[("decode", p.source, p.device, p.attention)].append((p.batch * p.kv_tokens, p))
    for p in load_prefill_attention(root):
        groups[("prefill", p.source, p.device, p.attention)].append((p.chunk_tokens, p))
    print(f"{'kind':7s} {'source':13s} {'dev':4s} {'q-kv-d tp':13s} {'n':>4s} {'median':>6s} "
          f"{'p95|e|':>6s} {'worst':>6s} {'@x':>8s}   x = batch*kv (decode), chunk (prefill)")
    for (kind, source, device, a), points in sorted(groups.items(), key=lambda i: str(i[0])):
        x = np.array([x for x, _ in points])
        pts = [p for _, p in points]
        roof = attention_ms(pts, FAMILIES[FAMILY_OF_DEVICE[device]])
        meas = np.array([p.time_us / 1e3 for p in pts])
        s = ErrorSummary.of(roof / meas - 1, x)
        heads = f"{a.q_heads}-{a.kv_heads}-{a.head_dim} tp{a.tp}"
        print(f"{kind:7s} {source:13s} {device:4s} {heads:13s} {s.n:4d} {_pct(s.median)} "
              f"{100 * s.p95_abs:6.1f} {_pct(s.worst)} {s.worst_at:8d}")
    print("(Vidur's A100 table is a 2024 vLLM kernel, not fitted on: the ampere family takes "
          "the hopper attention fit)\n")


def print_gemms(root: Path) -> None:
    """Implied efficiencies: the table's times are too fast for bf16, so both readings show."""
    print("## GEMMs (inference-sim H100): implied fraction of datasheet peak\n")
    print("bw: weight bytes (k x n) / time at the smallest m; fl: 2mkn / time at the largest m."
          "\nbf16 reading: 2-byte weights, 989 TFLOP/s; fp8 reading: 1-byte, 1979 TFLOP/s.\n")
    by_kn: dict[tuple[int, int], list] = defaultdict(list)
    for g in load_gemms(root):
        by_kn[(g.k, g.n)].append(g)
    print(f"{'k x n':12s} {'m_min':>5s} {'bw bf16':>7s} {'bw fp8':>6s} {'m_max':>6s} "
          f"{'fl bf16':>7s} {'fl fp8':>6s}")
    for (k, n), points in sorted(by_kn.items()):
        small, large = min(points, key=lambda g: g.m), max(points, key=lambda g: g.m)
        hw = device_hardware(small.device)
        bw = k * n / (small.time_us * 1e-6) / hw.memory_bandwidth_bytes_per_s
        fl = 2 * large.m * k * n / (large.time_us * 1e-6) / hw.bf16_flops_per_s
        print(f"{k:5d}x{n:<6d} {small.m:5d} {2 * bw:7.2f} {bw:6.2f} {large.m:6d} {fl:7.2f} "
              f"{fl / 2:6.2f}")
    print("(a bf16 fraction above 1 is impossible: this table is not comparable with a bf16 "
          "roofline)\n")


def print_cpu(root: Path) -> None:
    print("## Vidur A100 CPU overhead per step, ms (the roofline's flat overhead is 2.0)\n")
    host: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    ray: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for p in load_cpu_overheads(root):
        stages = dict(p.stages_ms)
        host[(p.model, p.tp)][p.batch] = p.total_ms - stages["ray_comm_time_mean"]
        ray[(p.model, p.tp)][p.batch] = stages["ray_comm_time_mean"]
    batches = sorted({b for v in host.values() for b in v})
    print(f"{'model':36s} tp {'':4s} " + " ".join(f"{b:>5d}" for b in batches))
    for (model, tp), v in sorted(host.items()):
        for label, table in (("host", v), ("ray", ray[(model, tp)])):
            cells = " ".join(f"{table.get(b, float('nan')):5.2f}" for b in batches)
            print(f"{model.split('/')[-1][:36]:36s} {tp:2d} {label:4s} {cells}")
    print("(host: schedule + sampler + prepare inputs + process outputs, medians; ray: Ray "
          "worker communication, mean, which Vidur adds on top)\n")


def plot(groups: dict[Fixture, tuple[LinearOpRow, ...]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for device in sorted({f.device for f in groups}):
        fixtures = [f for f in groups if f.device == device]
        models = sorted({(f.source, f.model) for f in fixtures})
        cols = min(4, len(models))
        nrows = -(-len(models) // cols)
        for kind in ("ms", "error"):
            fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows),
                                     squeeze=False, sharex=True)
            for ax, (source, model) in zip(axes.flat, models, strict=False):
                for f in (f for f in fixtures if (f.source, f.model) == (source, model)):
                    tokens, measured, roofline = stack_errors(groups[f])
                    _, _, before = stack_errors(groups[f], previous=True)
                    if kind == "ms":
                        line, = ax.plot(tokens, measured, label=f"tp{f.tp}")
                        ax.plot(tokens, roofline, "--", color=line.get_color())
                        ax.plot(tokens, before, ":", color=line.get_color(), lw=0.8)
                        ax.set_yscale("log")
                    else:
                        line, = ax.plot(tokens, 100 * (roofline / measured - 1),
                                        label=f"tp{f.tp}")
                        ax.plot(tokens, 100 * (before / measured - 1), ":", lw=0.8,
                                color=line.get_color())
                        ax.axhspan(-10, 10, color="0.9")
                        ax.axhline(0, color="0.5", lw=0.8)
                ax.set_xscale("log", base=2)
                ax.set_title(f"{model.split('/')[-1]} ({source})", fontsize=9)
                ax.legend(fontsize=6)
            for ax in axes.flat[len(models):]:
                ax.set_visible(False)
            for ax in axes[-1]:
                ax.set_xlabel("token rows")
            for ax in axes[:, 0]:
                ax.set_ylabel("linear stack ms" if kind == "ms" else "roofline / measured - 1 %")
            fig.suptitle(f"{device.upper()}: default roofline (solid) and previous (dotted) "
                         f"linear-op stack vs measured kernels (shaded ±10%)"
                         if kind == "error" else
                         f"{device.upper()}: linear-op stack, measured (solid), default "
                         f"roofline (dashed), previous roofline (dotted)")
            fig.tight_layout()
            path = out / f"{device}_stack_{kind}.png"
            fig.savefig(path, dpi=80)
            plt.close(fig)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="plots go here")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"--data: {args.data} is not a directory; calibration/measured/regenerate.py "
              f"writes it", file=sys.stderr)
        return 2
    try:
        groups = by_fixture(load_linear_ops(args.data))
        print_fixtures(groups)
        print_stack_table(groups)
        print_attention(args.data)
        print_gemms(args.data)
        print_cpu(args.data)
    except MeasuredDataError as exc:
        print(f"--data: {exc}", file=sys.stderr)
        return 2
    if not args.no_plots:
        for path in plot(groups, args.out):
            shown = path.resolve()
            print(f"wrote {shown.relative_to(REPO) if shown.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
