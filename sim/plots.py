"""PNG plots of a run: latency CDFs and the per-step time series.

Figures are built with `matplotlib.figure.Figure` (Agg canvas, no pyplot),
so nothing touches global backend state or leaks open figures. Long inputs
are reduced to at most `max_points` before drawing: a million-step run plots
as fast as a short one, while the CSVs keep every row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DEFAULT_MAX_POINTS = 5000
_LOG_X_RATIO = 100.0  # use a log x axis when p99 / p1 exceeds this


def bucket_series(x: np.ndarray, y: np.ndarray, max_points: int = DEFAULT_MAX_POINTS
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split into <= max_points equal-count buckets: (x mean, y mean, y min, y max)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size <= max_points:
        return x, y, y, y
    starts = np.linspace(0, x.size, max_points, endpoint=False).astype(np.int64)
    counts = np.diff(np.append(starts, x.size))
    return (np.add.reduceat(x, starts) / counts, np.add.reduceat(y, starts) / counts,
            np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts))


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


def _save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)
    fig.clear()
    return path


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _plot_cdf(ax: Axes, values_ms: np.ndarray, title: str, xlabel: str) -> None:
    v, frac = ecdf_points(values_ms)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0.0, 1.02)
    ax.grid(True, alpha=0.3)
    if v.size == 0:
        _no_data(ax)
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
    return _save(fig, path)


def _plot_series(ax: Axes, t_s: np.ndarray, y: np.ndarray, ylabel: str,
                 max_points: int) -> None:
    tx, mean, low, high = bucket_series(t_s, y, max_points)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if tx.size == 0:
        _no_data(ax)
        return
    if t_s.size > max_points:
        ax.fill_between(tx, low, high, alpha=0.25, linewidth=0, label="bucket min-max")
    ax.plot(tx, mean, linewidth=1.0)


def plot_timeseries(steps_df: pd.DataFrame, path: Path, kv_blocks_total: int | None = None,
                    max_points: int = DEFAULT_MAX_POINTS) -> Path:
    """Batch size, queue length and KV blocks used against simulated time, stacked."""
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    t_s = steps_df["start_s"].to_numpy(dtype=np.float64)
    kv = steps_df["kv_blocks_used"].to_numpy(dtype=np.float64)
    if kv_blocks_total:
        kv, kv_label = 100.0 * kv / kv_blocks_total, f"KV used (% of {kv_blocks_total})"
    else:
        kv_label = "KV blocks used"
    panels = ((steps_df["batch_size"], "batch size (seqs)", "Running batch per step"),
              (steps_df["num_waiting"], "queue (requests)", "Waiting queue length"),
              (kv, kv_label, "KV cache occupancy"))
    for ax, (y, ylabel, title) in zip(axes, panels, strict=True):
        _plot_series(ax, t_s, np.asarray(y, dtype=np.float64), ylabel, max_points)
        ax.set_title(title)
    axes[-1].set_xlabel("simulated time (s)")
    note = f", {len(t_s)} steps in {max_points} buckets" if len(t_s) > max_points else ""
    fig.suptitle(f"Run time series{note}")
    return _save(fig, path)
