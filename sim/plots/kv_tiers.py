"""kv_tiers.png: where each admission's cached prefix came from over the run, by tier.

With an offload tier (kv.offload_host_gib, optionally kv.offload_disk_gib) a prefix hit
is served by the GPU's own cache, the host tier or the disk tier; the run's summary
buckets those blocks over time (`kv_offload.hits_over_time`, sim.results.files.offload).
Stacked areas show the mix: a host tier that only fills after the GPU cache overflows
shows up as GPU hits giving way to host hits as the run goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from sim.plots.canvas import no_data, save_figure

_LABELS = {"gpu": "GPU prefix cache", "host": "host tier", "disk": "disk tier"}
_COLOURS = {"gpu": "#4c72b0", "host": "#dd8452", "disk": "#55a868"}


def kv_tiers_figure(offload: dict[str, Any]) -> Figure:
    """Blocks hit per second in each time bucket, stacked by tier (the GPU's cache first)."""
    hits = offload["hits_over_time"]
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(f"Prefix-cache hits by tier ({offload['load']} loads, unvalidated)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("blocks hit per second")
    ax.grid(True, alpha=0.3)
    names = [n for n in _LABELS if n in hits]
    start = np.asarray(hits["start_s"], dtype=np.float64)
    width = float(hits["bucket_s"])
    if not start.size or width <= 0:
        no_data(ax)
        return fig
    rates = [np.asarray(hits[n], dtype=np.float64) / width for n in names]
    ax.stackplot(start + width / 2, *rates, labels=[_LABELS[n] for n in names],
                 colors=[_COLOURS[n] for n in names], alpha=0.85)
    ax.set_xlim(0.0, float(start[-1] + width))
    ax.legend(loc="upper left", title="served from")
    return fig


def plot_kv_tiers(offload: dict[str, Any], path: Path) -> Path:
    return save_figure(kv_tiers_figure(offload), path)
