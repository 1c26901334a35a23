"""PNG plots of a run: latency CDFs, the bucketed time series, a fleet's load balance.

Figures are built with `matplotlib.figure.Figure` (Agg canvas, no pyplot),
so nothing touches global backend state or leaks open figures. The time
series arrives already reduced to at most a few thousand time buckets (see
`sim.results.record.time_buckets.TimeBuckets`), and CDFs are thinned to `max_points`, so a
million-step run plots as fast as a short one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.plots.canvas import no_data, save_figure
from sim.plots.kv_tiers import plot_kv_tiers
from sim.plots.timeline import plot_request_timeline

DEFAULT_MAX_POINTS = 5000
_LOG_X_RATIO = 100.0  # use a log x axis when p99 / p1 exceeds this


def ecdf_points(values: np.ndarray, max_points: int = DEFAULT_MAX_POINTS
                ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted finite values and their cumulative fractions, thinned to <= max_points."""
    raw = np.asarray(values, dtype=np.float64)
    v = np.sort(raw[np.isfinite(raw)])
    frac = np.arange(1, v.size + 1, dtype=np.float64) / max(v.size, 1)
    if v.size > max_points:
        idx = np.unique(np.linspace(0, v.size - 1, max_points).round().astype(np.int64))
        v, frac = v[idx], frac[idx]
    return v, frac


def _plot_cdf(ax: Axes, values_ms: np.ndarray, title: str, xlabel: str) -> None:
    v, frac = ecdf_points(values_ms)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0.0, 1.02)
    ax.grid(True, alpha=0.3)
    if v.size == 0:
        no_data(ax)
        return
    ax.step(v, frac, where="post")
    positive = v[v > 0]
    if positive.size:
        lo, hi = np.percentile(positive, [1, 99])
        if lo > 0 and hi / lo > _LOG_X_RATIO:
            ax.set_xscale("log")


def plot_latency_cdfs(requests_df: pd.DataFrame, path: Path) -> Path:
    """TTFT and TPOT empirical CDFs of finished requests, side by side, in ms."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_ttft, ax_tpot = fig.subplots(1, 2)
    _plot_cdf(ax_ttft, requests_df["ttft_ms"].to_numpy(dtype=np.float64),
              "Time to first token", "TTFT (ms)")
    _plot_cdf(ax_tpot, requests_df["tpot_ms"].to_numpy(dtype=np.float64),
              "Time per output token (excl. 1st)", "TPOT (ms)")
    fig.suptitle(f"Latency CDFs ({int((requests_df['status'] == 'finished').sum())} finished)")
    return save_figure(fig, path)


def _plot_series(ax: Axes, t_s: np.ndarray, mean: np.ndarray, peak: np.ndarray,
                 ylabel: str) -> None:
    """Busy-time mean per bucket as a line, the bucket maximum as a lighter band above it."""
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if t_s.size == 0:
        no_data(ax)
        return
    ax.fill_between(t_s, mean, peak, step="mid", alpha=0.25, linewidth=0, label="bucket max")
    ax.plot(t_s, peak, drawstyle="steps-mid", linewidth=0.6, alpha=0.5)
    ax.plot(t_s, mean, drawstyle="steps-mid", linewidth=1.0, label="time-weighted mean")
    ax.ticklabel_format(axis="y", useOffset=False)  # a flat 3.0 reads as 3, not 1e-12+3
    ax.legend(loc="upper right", fontsize="small")  # every panel: each is read on its own


def _plot_held_live(ax: Axes, t_s: np.ndarray, held: np.ndarray, live: np.ndarray,
                    ylabel: str) -> None:
    """KV slots held against live tokens: the band between them is the measured waste."""
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    known = np.isfinite(held)
    if not known.any():
        no_data(ax)
        return
    t_s, held, live = t_s[known], held[known], live[known]
    ax.fill_between(t_s, live, held, step="mid", alpha=0.3, color="tab:red", linewidth=0,
                    label="held, not live (waste)")
    # live first and wide, held dashed on top: with paged KV the two nearly coincide, and
    # held must not vanish under live
    ax.plot(t_s, live, drawstyle="steps-mid", linewidth=2.4, color="tab:green",
            label="live tokens", zorder=2)
    ax.plot(t_s, held, drawstyle="steps-mid", linewidth=1.0, color="tab:red",
            linestyle="--", label="held", zorder=3)
    ax.legend(loc="upper right", fontsize="small")


def plot_timeseries(series_df: pd.DataFrame, path: Path, kv_blocks_total: int | None = None,
                    kv_pool_tokens: int | None = None) -> Path:
    """`timeseries_figure` saved to `path`."""
    return save_figure(timeseries_figure(series_df, kv_blocks_total, kv_pool_tokens), path)


def timeseries_figure(series_df: pd.DataFrame, kv_blocks_total: int | None = None,
                      kv_pool_tokens: int | None = None) -> Figure:
    """Batch size, queue length, KV blocks used and KV held vs live against time, stacked.

    `series_df` is `RunRecorder.steps_frame()`: one row per time bucket. The
    held/live panel appears when the series has those columns. KV is drawn as a
    share of the pool when its size is given, the axis naming what 100% is.
    """
    held_live = {"mean_kv_slots_held", "mean_kv_live_tokens"} <= set(series_df.columns)
    fig = Figure(figsize=(11, 10.5 if held_live else 8), layout="constrained")
    axes = fig.subplots(4 if held_live else 3, 1, sharex=True)

    def col(name: str) -> np.ndarray:
        return series_df[name].to_numpy(dtype=np.float64)

    t_s = 0.5 * (col("t_start_s") + col("t_end_s"))
    kv_mean, kv_max = col("mean_kv_blocks_used"), col("max_kv_blocks_used")
    if kv_blocks_total:
        scale = 100.0 / kv_blocks_total
        kv_mean, kv_max = kv_mean * scale, kv_max * scale
        kv_label = f"KV used (% of {kv_blocks_total:,} KV blocks)"
    else:
        kv_label = "KV blocks used"
    panels = ((col("mean_batch_size"), col("max_batch_size"), "batch size (seqs)",
               "Running batch per step"),
              (col("mean_waiting"), col("max_waiting"), "queue (requests)",
               "Waiting queue length"),
              (kv_mean, kv_max, kv_label, "KV cache occupancy"))
    for ax, (mean, peak, ylabel, title) in zip(axes, panels, strict=False):
        _plot_series(ax, t_s, mean, peak, ylabel)
        ax.set_title(title)
    if held_live:
        held, live = col("mean_kv_slots_held"), col("mean_kv_live_tokens")
        label = "KV token slots"
        if kv_pool_tokens:
            held, live = held * (100.0 / kv_pool_tokens), live * (100.0 / kv_pool_tokens)
            label = f"% of {kv_pool_tokens:,} KV token slots"
        _plot_held_live(axes[3], t_s, held, live, label)
        axes[3].set_title("KV slots held vs live tokens (time-weighted mean per bucket)")
    axes[-1].set_xlabel("simulated time (s)")
    note = ""
    if t_s.size:
        width_s = float(series_df["t_end_s"].iloc[0] - series_df["t_start_s"].iloc[0])
        note = f", {t_s.size} buckets of {width_s:.3g} s"
    fig.suptitle(f"Run time series{note}")
    return fig


_REPLICA_STYLES = ("-", "--", "-.", ":")
_REPLICA_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_MARKS_PER_LINE = 12


def replica_style(i: int) -> dict[str, Any]:
    """Replica i's colour, line style and marker: no two of the first 40 replicas share all
    three, so overlapping lines stay apart in print and for colour-blind readers too."""
    return {"color": f"C{i % 10}", "linestyle": _REPLICA_STYLES[i % len(_REPLICA_STYLES)],
            "marker": _REPLICA_MARKERS[i % len(_REPLICA_MARKERS)], "markersize": 4}


def plot_load_balance(series: Sequence[pd.DataFrame], path: Path) -> Path:
    """`load_balance_figure` saved to `path`."""
    return save_figure(load_balance_figure(series), path)


def load_balance_figure(series: Sequence[pd.DataFrame]) -> Figure:
    """Outstanding requests and batch size per replica over time: how even the router is.

    `series` holds each replica's `RunRecorder.steps_frame()`; each line is the
    busy-time mean per bucket (a replica's buckets widen on their own, so each
    line keeps its own time axis). Outstanding = waiting + running after each step.
    """
    fig = Figure(figsize=(11, 7), layout="constrained")
    ax_out, ax_batch = fig.subplots(2, 1, sharex=True)
    for i, frame in enumerate(series):
        if frame.empty:
            continue
        t_s = 0.5 * (frame["t_start_s"].to_numpy(np.float64) + frame["t_end_s"].to_numpy(
            np.float64))
        outstanding = (frame["mean_waiting"] + frame["mean_running"]).to_numpy(np.float64)
        style = replica_style(i)
        every = max(1, t_s.size // _MARKS_PER_LINE)
        # markers staggered per replica, so that coinciding lines still show each one's
        start = (i * every) // max(len(series), 1)
        ax_out.plot(t_s, outstanding, drawstyle="steps-mid", linewidth=0.9,
                    markevery=(start, every), label=f"replica {i}", **style)
        ax_batch.plot(t_s, frame["mean_batch_size"].to_numpy(np.float64),
                      drawstyle="steps-mid", linewidth=0.9, markevery=(start, every),
                      label=f"replica {i}", **style)
    for ax, ylabel, title in ((ax_out, "requests", "Outstanding requests (waiting + running)"),
                              (ax_batch, "batch size (seqs)", "Running batch per step")):
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(loc="upper right", fontsize="small", ncol=min(4, len(series)))
        else:
            no_data(ax)
    ax_batch.set_xlabel("simulated time (s)")
    fig.suptitle(f"Load balance across {len(series)} replicas (time-weighted mean per bucket)")
    return fig


def plot_run(out_dir: Path, summary: dict[str, Any], requests: pd.DataFrame,
             series: pd.DataFrame, replica_series: Sequence[pd.DataFrame] = (),
             timeline: pd.DataFrame | None = None) -> list[Path]:
    """A run's pictures in `out_dir`: latency_cdf.png and timeseries.png, plus
    load_balance.png for a fleet (`replica_series`, one per replica), timeline.png for
    a traced run and kv_tiers.png when an offload tier is configured. The series is at
    most 2048 buckets, so this stays fast."""
    out_dir = Path(out_dir)
    written = [plot_latency_cdfs(requests, out_dir / "latency_cdf.png"),
               plot_timeseries(series, out_dir / "timeseries.png",
                               kv_blocks_total=summary.get("kv_blocks_total"),
                               kv_pool_tokens=summary.get("kv_pool_tokens"))]
    if len(replica_series) > 1:
        written.append(plot_load_balance(replica_series, out_dir / "load_balance.png"))
    if timeline is not None:
        written.append(plot_request_timeline(timeline, out_dir / "timeline.png"))
    if summary.get("kv_offload"):  # an offload tier is configured (sim.plots.kv_tiers)
        written.append(plot_kv_tiers(summary["kv_offload"], out_dir / "kv_tiers.png"))
    return written
