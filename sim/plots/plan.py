"""`servesim plan`'s picture: each candidate's cheapest passing fleet, its cost and p99 TTFT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.plots.canvas import no_data, save_figure


def plot_plan(table: pd.DataFrame, cost_label: str, percentile: str, path: Path) -> Path:
    """Bars of cost per configuration (cheapest first, the answer highlighted) beside its
    TTFT percentile with the 95% interval."""
    fig = Figure(figsize=(11, max(3.0, 0.5 * len(table) + 1.5)), layout="constrained")
    ax_cost, ax_ttft = fig.subplots(1, 2, sharey=True)
    if not len(table):
        no_data(ax_cost)
        no_data(ax_ttft)
        return save_figure(fig, path)
    labels = [f"{r.gpu} TP{r.tp} x{r.replicas}" for r in table.itertuples()]
    y = np.arange(len(table))[::-1]
    colors = ["C2"] + ["C0"] * (len(table) - 1)
    ax_cost.barh(y, table["cost"], color=colors)
    ax_cost.set_yticks(y, labels)
    ax_cost.set_xlabel(cost_label)
    ax_cost.set_title("Cheapest passing fleet per GPU and TP (green: the answer)")
    est = table[f"{percentile}_ttft_ms"].to_numpy(dtype=np.float64)
    err = np.nan_to_num([est - table[f"{percentile}_ttft_ms_lo"].to_numpy(dtype=np.float64),
                         table[f"{percentile}_ttft_ms_hi"].to_numpy(dtype=np.float64) - est])
    ax_ttft.errorbar(est, y, xerr=np.maximum(err, 0), fmt="o", capsize=3)
    ax_ttft.set_xlabel(f"{percentile} TTFT (ms), 95% CI")
    ax_ttft.set_title("Latency of each")
    for ax in (ax_cost, ax_ttft):
        ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, path)
