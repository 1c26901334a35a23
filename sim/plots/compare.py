"""PNG plots of a compare: load curves, latency vs throughput, the Pareto view, waste bars.

Input is the compare table (one row per variant x offered rate), at most a
few dozen rows, so every plot is instant. Plain matplotlib `Figure`s on the
Agg canvas, as in `sim.plots`: no pyplot, no global state.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from sim.plots.canvas import no_data, save_figure


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


def _achieved(ax: Axes, rows: pd.DataFrame, name: str) -> None:
    """The window's achieved rate with its 95% interval as error bars (hollow: unsustained);
    a table without the window's columns: the whole run's rate."""
    if "window_throughput" not in rows:
        ax.plot(*_xy(rows, "offered_rate", "request_throughput"), marker="o", label=name)
        return
    x, y = _xy(rows, "offered_rate", "window_throughput")
    # a rate's interval never reaches below 0 (sim.results.files.steady cuts it there); a
    # table written before that cut is read the same way
    lo = y - np.maximum(rows["window_throughput_lo"].to_numpy(dtype=np.float64), 0.0)
    hi = rows["window_throughput_hi"].to_numpy(dtype=np.float64) - y
    line = ax.errorbar(x, y, yerr=np.nan_to_num([lo, hi]), marker="o", capsize=3, label=name)
    gone = ~rows["sustained"].to_numpy(dtype=bool)
    if gone.any():
        ax.plot(x[gone], y[gone], "o", markerfacecolor="white", zorder=3,
                color=line.lines[0].get_color())


def plot_throughput(table: pd.DataFrame, path: Path) -> Path:
    """`throughput_figure` saved to `path`."""
    return save_figure(throughput_figure(table), path)


def throughput_figure(table: pd.DataFrame) -> Figure:
    """Achieved request throughput (steady state, 95% CI; hollow = not sustained) and
    output-token throughput against the offered rate."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_req, ax_tok = fig.subplots(1, 2)
    for name, rows in _variants(table):
        _achieved(ax_req, rows, name)
        ax_tok.plot(*_xy(rows, "offered_rate", "output_throughput"), marker="o", label=name)
    if len(table):
        top = float(table["offered_rate"].max())
        ax_req.plot([0, top], [0, top], "k--", linewidth=0.8, label="achieved = offered")
    _finish(ax_req, "Requests (window, 95% CI; hollow: not sustained)", "offered rate (req/s)",
            "achieved (req/s)")
    _finish(ax_tok, "Output tokens", "offered rate (req/s)", "output throughput (tok/s)")
    fig.suptitle("Achieved throughput vs offered load")
    return fig


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


# Axis labels, with units, for the scenario fields people sweep; others fall back to
# `field_label`'s reading of the name.
FIELD_LABELS: Mapping[str, str] = MappingProxyType({
    "workload.prompt_tokens.value": "prompt length (tokens)",
    "workload.output_tokens.value": "output length (tokens)",
    "workload.arrivals.rate": "arrival rate (req/s)",
    "workload.arrivals.burstiness": "burstiness (gamma shape; 1 = Poisson)",
    "workload.num_requests": "requests (count)",
    "workload.trace.time_scale": "trace speed-up (x)",
    "scheduler.max_num_seqs": "max running sequences (seqs)",
    "scheduler.max_num_batched_tokens": "token budget per step (tokens)",
    "scheduler.batch_size": "batch size (requests)",
    "scheduler.max_wait_ms": "max batch wait (ms)",
    "scheduler.max_model_len": "max model length (tokens)",
    "kv.block_size": "KV block size (tokens)",
    "kv.num_blocks": "KV pool (blocks)",
    "model.kv_dtype": "KV cache dtype",
    "model.weight_dtype": "weight dtype",
    "kv.host_swap_gib": "host swap space (GiB)",
    "hardware.count": "GPUs per replica (tensor parallel)",
    "hardware.memory_utilization": "GPU memory for serving (fraction)",
    "replicas": "replicas (count)",
    "speculative.num_tokens": "draft tokens per step (k)",
    "speculative.acceptance.alpha": "draft acceptance rate (alpha)",
    "slo.ttft_ms": "TTFT SLO (ms)",
    "slo.tpot_ms": "TPOT SLO (ms)",
    "latency.step_overhead_ms": "step overhead (ms)",
})
_UNIT_SUFFIXES = (("_ms", "ms"), ("_s", "s"), ("_tokens", "tokens"), ("_gib", "GiB"),
                  ("_bytes", "bytes"), ("rate", "req/s"))


def field_label(key: str) -> str:
    """A readable label with its unit for a scenario field path ("arrival rate (req/s)")."""
    if key in FIELD_LABELS:
        return FIELD_LABELS[key]
    leaf = [part for part in key.split(".") if part != "value"][-1]
    for suffix, unit in _UNIT_SUFFIXES:
        if leaf.endswith(suffix):
            words = leaf.removesuffix(suffix).replace("_", " ").strip() or leaf
            return f"{words} ({unit})"
    return f"{leaf.replace('_', ' ')} ({key})"


def value_label(key: str, value: object) -> str:
    """One grid value in words: "arrival rate 0.02 req/s"."""
    name, _, unit = field_label(key).partition(" (")
    unit = unit.removesuffix(")")
    text = f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) \
        else str(value)
    return f"{name} {text} {unit}" if unit and unit != key else f"{name} {text}"


_SWEEP_PANELS = (
    ("Concurrency reached", "peak running sequences (seqs)",
     (("max_num_running", "peak"),)),
    ("Time to first token", "TTFT (ms)", (("median_ttft_ms", "p50"), ("p99_ttft_ms", "p99"))),
    ("Time per output token", "TPOT (ms)",
     (("median_tpot_ms", "p50"), ("p99_tpot_ms", "p99"))),
    ("Output throughput", "output throughput (tok/s)", (("output_throughput", ""),)),
)
_STAT_STYLES = {"p99": "--"}  # p50, peak and totals solid


def _plain_number(value: float, _position: object = None) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _band(ax: Axes, rows: pd.DataFrame, x: str, column: str, color: str) -> None:
    """The measurement window's 95% interval of `column` around its own window estimate,
    over every point that has one; a point without (too few requests in its window for
    batch means) is drawn as a hollow ring on the line so that the gap reads as such."""
    band = f"window_{column}"
    if f"{band}_lo" not in rows:
        return
    xs = rows[x].to_numpy(dtype=np.float64)
    lo = rows[f"{band}_lo"].to_numpy(dtype=np.float64)
    hi = rows[f"{band}_hi"].to_numpy(dtype=np.float64)
    known = np.isfinite(lo) & np.isfinite(hi)
    if known.any():
        label = "95% CI (window)" if (hi[known] > lo[known]).any() and not any(
            t.startswith("95% CI") for t in ax.get_legend_handles_labels()[1]) else None
        ax.fill_between(xs, np.where(known, lo, np.nan), np.where(known, hi, np.nan),
                        color=color, alpha=0.15, linewidth=0, label=label)
        # and a bar at each point, so that a lone point between gaps shows its interval
        ax.errorbar(xs[known], (lo[known] + hi[known]) / 2, yerr=(hi[known] - lo[known]) / 2,
                    fmt="none", ecolor=color, alpha=0.6, capsize=3)
    gap = ~known
    if gap.any():
        label = "no CI (window too short)" if not any(
            t.startswith("no CI") for t in ax.get_legend_handles_labels()[1]) else None
        ax.plot(xs[gap], rows[column].to_numpy(dtype=np.float64)[gap], "o", ms=9,
                markerfacecolor="none", color=color, label=label)


def sweep_figure(table: pd.DataFrame, grid_keys: list[str]) -> Figure:
    """Peak concurrency, TTFT, TPOT and throughput against the sweep's first numeric key.

    Shaded: the measurement window's 95% interval of the p99s (sim.results.files.steady).
    One colour per value of the other grid keys (e.g. per arrival rate when the
    x axis is the prompt length), the same in every panel; p50 solid, p99
    dashed; log-2 x when the values span a factor of 8.
    """
    numeric = [k for k in grid_keys if pd.api.types.is_numeric_dtype(table[k])]
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2)
    x = numeric[0] if numeric else None
    others = [k for k in grid_keys if k != x]
    groups = [("", table)] if not others else [
        (", ".join(value_label(k, v) for k, v in zip(
            others, key if isinstance(key, tuple) else (key,), strict=True)), rows)
        for key, rows in table.groupby(others, sort=False)]
    xlabel = field_label(x) if x is not None else "no numeric grid key"
    for ax, (title, ylabel, columns) in zip(axes.flat, _SWEEP_PANELS, strict=True):
        for i, (label, rows) in enumerate(groups if x is not None else []):
            rows = rows.sort_values(x)
            for column, what in columns:
                if column in rows and rows[column].notna().any():
                    name = " ".join(p for p in (label, what) if p) or ylabel
                    ax.plot(*_xy(rows, x, column), marker="o", color=f"C{i % 10}",
                            linestyle=_STAT_STYLES.get(what, "-"), label=name)
                    _band(ax, rows, x, column, f"C{i % 10}")
        if x is not None and table[x].min() > 0 and table[x].max() >= 8 * table[x].min():
            ax.set_xscale("log", base=2)
        if x is not None:  # ticks at the values swept (3,840, not the power of 2 near it)
            ticks = np.unique(table[x].to_numpy(dtype=np.float64))
            if ticks.size <= 12:
                ax.set_xticks(ticks, [_plain_number(t) for t in ticks], rotation=30)
                ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        values = table[[c for c, _ in columns if c in table]].to_numpy(dtype=np.float64)
        if ax.has_data() and np.nanmin(values) > 0 and np.nanmax(values) > 20 * np.nanmin(values):
            ax.set_yscale("log")  # only when the curves span decades
        _finish(ax, title, xlabel, ylabel)
    fig.suptitle("Sweep over " + " and ".join(field_label(k).partition(" (")[0]
                                              for k in grid_keys))
    return fig


def plot_sweep(table: pd.DataFrame, grid_keys: list[str], path: Path) -> Path:
    """`sweep_figure` saved to `path`."""
    return save_figure(sweep_figure(table, grid_keys), path)


def write_plots(table: pd.DataFrame, waste_rate: float, out_dir: Path) -> list[Path]:
    return [plot_throughput(table, out_dir / "throughput.png"),
            plot_latency(table, out_dir / "latency_vs_throughput.png"),
            plot_pareto(table, out_dir / "pareto.png"),
            plot_waste(table, waste_rate, out_dir / "waste.png")]
