"""PNG plots of a compare: load curves, latency vs throughput, the Pareto view, waste bars.

Input is the compare table (one row per variant x offered rate), at most a
few dozen rows, so every plot is instant. Plain matplotlib `Figure`s on the
Agg canvas, as in `sim.plots`: no pyplot, no global state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.plots import no_data, save_figure


def _variants(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [(str(name), rows.sort_values("offered_rate"))
            for name, rows in table.groupby("variant", sort=False)]


def _xy(rows: pd.DataFrame, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    return rows[x].to_numpy(dtype=np.float64), rows[y].to_numpy(dtype=np.float64)


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize="small")
    else:
        no_data(ax)


def plot_throughput(table: pd.DataFrame, path: Path) -> Path:
    """Achieved request and output-token throughput against the offered rate."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_req, ax_tok = fig.subplots(1, 2)
    for name, rows in _variants(table):
        ax_req.plot(*_xy(rows, "offered_rate", "request_throughput"), marker="o", label=name)
        ax_tok.plot(*_xy(rows, "offered_rate", "output_throughput"), marker="o", label=name)
    if len(table):
        top = float(table["offered_rate"].max())
        ax_req.plot([0, top], [0, top], "k--", linewidth=0.8, label="achieved = offered")
    _finish(ax_req, "Requests", "offered rate (req/s)", "achieved (req/s)")
    _finish(ax_tok, "Output tokens", "offered rate (req/s)", "output throughput (tok/s)")
    fig.suptitle("Achieved throughput vs offered load")
    return save_figure(fig, path)


def plot_latency(table: pd.DataFrame, path: Path) -> Path:
    """p50 and p99 TTFT and TPOT against achieved output throughput."""
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2)
    panels = (("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
              ("median_tpot_ms", "TPOT p50"), ("p99_tpot_ms", "TPOT p99"))
    for ax, (column, title) in zip(axes.flat, panels, strict=True):
        for name, rows in _variants(table):
            x, y = _xy(rows, "output_throughput", column)
            if np.isfinite(y).any():
                ax.plot(x, y, marker="o", label=name)
        values = table[column].to_numpy(dtype=np.float64)
        if ax.has_data() and np.nanmin(values) > 0 and np.nanmax(values) > 20 * np.nanmin(values):
            ax.set_yscale("log")  # only when the curves span decades
        _finish(ax, title, "output throughput (tok/s)", f"{title.split()[0]} (ms)")
    fig.suptitle("Latency vs throughput (each point one offered rate)")
    return save_figure(fig, path)


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both x and y, by increasing x."""
    keep = np.isfinite(x) & np.isfinite(y)
    idx = np.flatnonzero(keep)
    order = idx[np.lexsort((-y[idx], -x[idx]))]  # x descending, ties: best y first
    front, best_y = [], -np.inf
    for i in order:
        if y[i] > best_y:
            front.append(i)
            best_y = y[i]
    return np.array(front[::-1], dtype=np.int64)


def plot_pareto(table: pd.DataFrame, path: Path) -> Path:
    """Tokens/s per user against tokens/s per GPU: up and right is better on both."""
    fig = Figure(figsize=(7.5, 5.5), layout="constrained")
    ax = fig.subplots()
    for name, rows in _variants(table):
        ax.plot(*_xy(rows, "tokens_per_s_per_user", "tokens_per_s_per_gpu"), marker="o",
                label=name)
    x, y = _xy(table, "tokens_per_s_per_user", "tokens_per_s_per_gpu")
    front = pareto_front(x, y)
    if front.size > 1:
        ax.plot(x[front], y[front], "k--", linewidth=1.0, label="Pareto front")
    _finish(ax, "Interactivity vs throughput (each point one offered rate)",
            "tokens/s per user (1000 / mean TPOT)", "output tokens/s per GPU")
    return save_figure(fig, path)


def plot_waste(table: pd.DataFrame, rate: float, path: Path) -> Path:
    """Slot utilisation and KV waste per variant at one offered rate."""
    rows = table[table["offered_rate"] == rate]
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax_slot, ax_kv = fig.subplots(1, 2)
    names = rows["variant"].astype(str).tolist()
    pos = np.arange(len(names))
    util = rows["slot_utilization"].to_numpy(dtype=np.float64) * 100
    waste = rows["kv_waste_of_held"].to_numpy(dtype=np.float64) * 100
    panels = ((ax_slot, util, "Batch slots doing real work", "% of slot-steps", "tab:blue"),
              (ax_kv, waste, "Held KV not holding a live token", "% of held KV (time avg)",
               "tab:red"))
    for ax, values, title, ylabel, color in panels:
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 105)
        ax.grid(True, axis="y", alpha=0.3)
        if not np.isfinite(values).any():
            no_data(ax)
            continue
        bars = ax.bar(pos, np.nan_to_num(values), color=color)
        ax.bar_label(bars, labels=[f"{v:.1f}" if np.isfinite(v) else "n/a" for v in values])
        ax.set_xticks(pos, names, rotation=20, ha="right")
    fig.suptitle(f"Measured waste at {rate:g} req/s offered")
    return save_figure(fig, path)


def plot_sweep(table: pd.DataFrame, grid_keys: list[str], path: Path) -> Path:
    """Peak concurrency, TTFT, TPOT and throughput against the sweep's first numeric key.

    One line per value of the other grid keys (e.g. per arrival rate when the
    x axis is the prompt length); log-2 x when the values span a factor of 8.
    """
    numeric = [k for k in grid_keys if pd.api.types.is_numeric_dtype(table[k])]
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2)
    x = numeric[0] if numeric else None
    others = [k for k in grid_keys if k != x]
    groups = [("", table)] if not others else [
        (", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(
            others, key if isinstance(key, tuple) else (key,), strict=True)), rows)
        for key, rows in table.groupby(others, sort=False)]
    panels = ((("max_num_running", "peak running sequences"),), (("median_ttft_ms", "p50"),
              ("p99_ttft_ms", "p99")), (("median_tpot_ms", "p50"), ("p99_tpot_ms", "p99")),
              (("output_throughput", "output tok/s"),))
    titles = ("Concurrency reached", "TTFT (ms)", "TPOT (ms)", "Output throughput (tok/s)")
    for ax, columns, title in zip(axes.flat, panels, titles, strict=True):
        for label, rows in groups if x is not None else []:
            rows = rows.sort_values(x)
            for column, what in columns:
                if column in rows and rows[column].notna().any():
                    name = " ".join(p for p in (label, what) if p)
                    ax.plot(*_xy(rows, x, column), marker="o", label=name)
        if x is not None and table[x].min() > 0 and table[x].max() >= 8 * table[x].min():
            ax.set_xscale("log", base=2)
        values = table[[c for c, _ in columns if c in table]].to_numpy(dtype=np.float64)
        if ax.has_data() and np.nanmin(values) > 0 and np.nanmax(values) > 20 * np.nanmin(values):
            ax.set_yscale("log")  # only when the curves span decades
        _finish(ax, title, x or "no numeric grid key", title)
    fig.suptitle("Sweep: " + ", ".join(grid_keys))
    return save_figure(fig, path)


def write_plots(table: pd.DataFrame, waste_rate: float, out_dir: Path) -> list[Path]:
    return [plot_throughput(table, out_dir / "throughput.png"),
            plot_latency(table, out_dir / "latency_vs_throughput.png"),
            plot_pareto(table, out_dir / "pareto.png"),
            plot_waste(table, waste_rate, out_dir / "waste.png")]
