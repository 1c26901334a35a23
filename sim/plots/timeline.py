"""The request Gantt chart: each traced request's life, step by step, on its own row.

Time is measured from each request's arrival: waiting, each prefill chunk,
each decode step, preemption and recomputation, with its first token and
finish marked; the left panel zooms on the time to first token. The rows come
from sim.observe.trace's timeline frame. Plain matplotlib (Agg).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.observe.trace import MARK_KINDS, RUN_KINDS, WAIT_KINDS
from sim.plots.canvas import save_figure

KIND_COLORS = {"queue": "#bdbdbd", "batch_fill": "#e0e0e0", "kv_wait": "#fdae61",
               "preempted": "#d7191c", "prefill": "#2c7bb6", "recompute": "#7b3294",
               "decode": "#1a9641", "stalled": "#c2e699"}
KIND_LABELS = {"queue": "queued for admission", "batch_fill": "waiting for its batch to fill",
               "kv_wait": "waiting for KV blocks", "preempted": "preempted, waiting",
               "prefill": "prefill chunk", "recompute": "recompute after preemption",
               "decode": "decode: one token per step",
               "stalled": "stalled: in the batch, no token this step"}


def merge_runs(bars: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, width) bars with back-to-back neighbours joined: thousands of decode steps
    drawn one by one, white edges and all, would read as a lighter green than a few."""
    merged: list[tuple[float, float]] = []
    for start, width in sorted(bars):
        if merged and abs(merged[-1][0] + merged[-1][1] - start) <= 1e-9 * max(1.0, start):
            merged[-1] = (merged[-1][0], start + width - merged[-1][0])
        else:
            merged.append((start, width))
    return merged


def plot_request_timeline(frame: pd.DataFrame, path: Path | None = None,
                          requests: Sequence[int] | None = None) -> Path | Figure:
    """Gantt chart of `frame` (sim.observe.trace's timeline), one row per request; saved to `path`
    when given (returns the path), else returned as a Figure (for notebooks)."""
    traced = sorted(int(r) for r in frame["request_id"].unique())
    if requests is not None:
        unknown = sorted(set(requests) - set(traced))
        if unknown:
            raise ValueError(f"requests {unknown} were not traced in this run; traced: {traced}")
        traced = sorted(set(requests))
    fig = Figure(figsize=(12, 1.0 + 0.45 * max(1, len(traced))), layout="constrained")
    zoom, whole = fig.subplots(1, 2, sharey=True, width_ratios=(1, 2))
    ttft_max_ms = 1.0
    for row, rid in enumerate(traced):
        rows = frame[frame["request_id"] == rid]
        t0 = rows["start_s"].min()
        for kind, group in rows.groupby("kind"):
            if kind in MARK_KINDS:
                continue
            bars = list(zip((group["start_s"] - t0) * 1e3, (group["end_s"] - group["start_s"])
                            * 1e3, strict=True))
            edge = "white" if kind in RUN_KINDS else "none"
            # step by step (white edges) to the first token; runs of steps joined after it
            for ax, drawn, edges in ((zoom, bars, edge), (whole, merge_runs(bars), "none")):
                bar = ax.broken_barh(drawn, (row - 0.35, 0.7),
                                     facecolors=KIND_COLORS[str(kind)], edgecolor=edges,
                                     linewidth=0.3)
                bar.set_in_layout(False)  # the layout need not measure thousands of bars
        for kind, marker in (("first_token", "*"), ("finish", "|")):
            at = rows.loc[rows["kind"] == kind, "start_s"]
            if len(at):
                x = (float(at.iloc[0]) - t0) * 1e3
                if kind == "first_token":
                    ttft_max_ms = max(ttft_max_ms, x)
                for ax in (zoom, whole):
                    ax.plot([x], [row], marker=marker, color="black", markersize=9)
    zoom.set_xlim(0, ttft_max_ms * 1.08)
    zoom.set_title("to the first token (white lines: step boundaries)")
    whole.set_title("whole request (consecutive steps joined)")
    zoom.set_yticks(range(len(traced)), [f"req {rid}" for rid in traced])
    zoom.invert_yaxis()
    for ax in (zoom, whole):
        ax.set_xlabel("ms since arrival")
        ax.grid(True, axis="x", alpha=0.3)
    kinds = set(frame["kind"])
    handles = [Patch(color=KIND_COLORS[k], label=KIND_LABELS[k])
               for k in (*WAIT_KINDS, *RUN_KINDS) if k in kinds]
    handles += [whole.plot([], [], "k*", label="first token")[0],
                whole.plot([], [], "k|", label="finish")[0]]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4))
    noun = "request" if len(traced) == 1 else "requests"
    fig.suptitle(f"Request timelines ({len(traced)} traced {noun})")
    if path is None:
        FigureCanvasAgg(fig)
        return fig
    return save_figure(fig, path)
