"""A live server measured against the simulator: overlaid latency CDFs (sim.serve.fidelity)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.plots.canvas import no_data, save_figure
from sim.plots.run import ecdf_points

_STYLES = {"measured": ("black", "-"), "simulated": ("tab:blue", "--")}


def plot_measured_vs_simulated(requests: pd.DataFrame, path: Path, title: str) -> Path:
    """TTFT, TPOT and E2EL CDFs: columns `{metric}_ms_measured` and `{metric}_ms_simulated`."""
    fig = Figure(figsize=(14, 4.2), layout="constrained")
    for ax, metric in zip(fig.subplots(1, 3), ("ttft", "tpot", "e2el"), strict=True):
        drawn = False
        for source, (color, line) in _STYLES.items():
            v, frac = ecdf_points(requests[f"{metric}_ms_{source}"].to_numpy(dtype=np.float64))
            if v.size:
                ax.step(v, frac, where="post", color=color, linestyle=line, label=source)
                drawn = True
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0.0, 1.02)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend()
        else:
            no_data(ax)
    fig.suptitle(title)
    return save_figure(fig, path)
