"""`servesim plan`'s picture: each candidate's cheapest passing fleet, its cost, and its TTFT
and TPOT percentiles against the SLO bounds the plan was asked to meet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.plots.canvas import no_data, save_figure


def _latency_panel(ax: Axes, table: pd.DataFrame, y: np.ndarray, column: str, what: str,
                   slo_ms: float | None) -> None:
    """One percentile with its 95% interval per fleet, and the SLO bound as a red line."""
    est = table[column].to_numpy(dtype=np.float64)
    err = np.nan_to_num([est - table[f"{column}_lo"].to_numpy(dtype=np.float64),
                         table[f"{column}_hi"].to_numpy(dtype=np.float64) - est])
    ax.errorbar(est, y, xerr=np.maximum(err, 0), fmt="o", capsize=3,
                label=f"{what}, 95% CI")
    if slo_ms is not None:
        ax.axvline(slo_ms, color="tab:red", linestyle="--", label=f"SLO: {what} <= {slo_ms:g} ms")
        ax.set_xlim(left=0, right=max(ax.get_xlim()[1], 1.05 * slo_ms))
    ax.set_xlabel(f"{what} (ms)")
    ax.set_title(f"{what} of each")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize="small")
    # below the axes: inside, it would hide the bottom fleet's point


def plan_figure(table: pd.DataFrame, cost_label: str, percentile: str,
                ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None) -> Figure:
    """Bars of cost per configuration (cheapest first, the answer highlighted) beside its
    TTFT and TPOT percentiles with their 95% intervals and the SLO bounds."""
    fig = Figure(figsize=(14, max(3.0, 0.5 * len(table) + 1.5)), layout="constrained")
    ax_cost, ax_ttft, ax_tpot = fig.subplots(1, 3, sharey=True)
    if not len(table):
        for ax in (ax_cost, ax_ttft, ax_tpot):
            no_data(ax)
        return fig
    labels = [f"{r.gpu} {getattr(r, 'layout', None) or f'TP{r.tp} x{r.replicas}'}"
              for r in table.itertuples()]
    y = np.arange(len(table))[::-1]
    colors = ["C2"] + ["C0"] * (len(table) - 1)
    ax_cost.barh(y, table["cost"], color=colors)
    ax_cost.set_yticks(y, labels)
    ax_cost.set_xlabel(cost_label)
    ax_cost.set_title("Cheapest passing fleet per GPU and TP (green: the answer)")
    _latency_panel(ax_ttft, table, y, f"{percentile}_ttft_ms", f"{percentile} TTFT",
                   ttft_slo_ms)
    _latency_panel(ax_tpot, table, y, f"{percentile}_tpot_ms", f"{percentile} TPOT",
                   tpot_slo_ms)
    for ax in (ax_cost, ax_ttft, ax_tpot):
        ax.grid(True, axis="x", alpha=0.3)
    return fig


def plot_plan(table: pd.DataFrame, cost_label: str, percentile: str, path: Path,
              ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None) -> Path:
    """`plan_figure` saved to `path`."""
    return save_figure(plan_figure(table, cost_label, percentile, ttft_slo_ms, tpot_slo_ms),
                       path)
