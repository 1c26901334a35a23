"""Batch slots over time, one panel per policy: who holds each slot, padded and empty ones too.

The picture of continuous batching: the same requests under static and
continuous batching with the same slots (recorded by sim.observe.slots'
SlotRecorder, run by sim.experiments.slots). Plain matplotlib (Agg).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.observe.slots import SlotRecorder
from sim.plots.canvas import save_figure

_EMPTY, _NO_STEP, _PADDED = (1.0, 1.0, 1.0, 1.0), (0.93, 0.93, 0.93, 1.0), (0.45, 0.45, 0.45, 1.0)


def slot_grid(recorder: SlotRecorder, num_slots: int, x: str = "step"
              ) -> tuple[np.ndarray, np.ndarray]:
    """Column edges (step numbers, or seconds with `x="time"`, where idle gaps between
    steps get a column too) and an RGBA image (slots x columns): a hue per request,
    darker while it prefills, paler while it holds its slot without tokens; grey padding,
    white empty slots, light grey where no step ran."""
    from matplotlib import colormaps

    tab10 = colormaps["tab10"]
    hues = [tab10(i)[:3] for i in range(10) if i != 7]  # not its grey: grey means padding
    steps = recorder.steps
    columns: list[list[tuple[int, int, str]] | None] = []
    if x == "step":
        edges = list(range(len(steps) + 1))
        columns = [cells for _, _, cells in steps]
    else:
        edges = [steps[0][0]] if steps else [0.0]
        for start_s, duration_s, cells in steps:
            if start_s > edges[-1]:
                edges.append(start_s)
                columns.append(None)
            edges.append(start_s + duration_s)
            columns.append(cells)
    image = np.empty((num_slots, len(columns), 4))
    for j, cells in enumerate(columns):
        image[:, j] = _NO_STEP if cells is None else _EMPTY
        for slot, rid, kind in cells or ():
            if kind == "padded":
                image[slot, j] = _PADDED
                continue
            rgb = np.array(hues[rid % len(hues)])
            if kind == "prefill":
                rgb = rgb * 0.55
            elif kind == "stalled":
                rgb = 1.0 - 0.3 * (1.0 - rgb)
            image[slot, j] = (*rgb, 1.0)
    return np.array(edges, dtype=np.float64), image


def slot_use(recorder: SlotRecorder, num_slots: int) -> float:
    """Share of slot-steps doing real work (a prefill chunk or a decode)."""
    useful = sum(kind in ("prefill", "decode") for _, _, cells in recorder.steps
                 for _, _, kind in cells)
    total = num_slots * len(recorder.steps)
    return useful / total if total else float("nan")


def plot_slot_timelines(recorders: Mapping[str, SlotRecorder], path: Path | None = None,
                        slots: int | None = None, x: str = "step") -> Path | Figure:
    """One panel per policy: who holds each batch slot, step by step (or over time)."""
    if x not in ("step", "time"):
        raise ValueError(f"x must be 'step' or 'time', got {x!r}")
    num_slots = max([slots or 0, *(r.num_slots for r in recorders.values())]) or 1
    fig = Figure(figsize=(12, 1.4 + 0.3 * num_slots * len(recorders)), layout="constrained")
    axes = fig.subplots(len(recorders), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (policy, rec) in zip(axes, recorders.items(), strict=True):
        edges, image = slot_grid(rec, num_slots, x)
        ax.pcolormesh(edges, np.arange(num_slots + 1), image, shading="flat")
        steps = (f"{len(rec.steps)} steps" if rec.steps_seen <= len(rec.steps) else
                 f"first {len(rec.steps)} of {rec.steps_seen} steps")
        ax.set_title(f"{policy}: {steps}, slot use {slot_use(rec, num_slots):.0%}"
                     f", {rec.num_finished} requests finished")
        ax.set_ylabel("batch slot")
        ax.set_ylim(num_slots, 0)
    axes[-1].set_xlabel("engine step" if x == "step" else "simulated time (s)")
    blue = np.array((0.12, 0.47, 0.71))
    handles = [Patch(color=blue * 0.55, label="prefill (darker)"),
               Patch(color=blue, label="decode (a hue per request)"),
               Patch(color=1.0 - 0.3 * (1.0 - blue), label="holds its slot, no tokens"),
               Patch(color=_PADDED, label="padded slot"),
               Patch(facecolor=_EMPTY, edgecolor="0.6", label="empty slot")]
    if x == "time":
        handles.append(Patch(color=_NO_STEP, label="no step running"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3)
    fig.suptitle(f"Batch slots, {num_slots} per policy, the same requests")
    if path is None:
        FigureCanvasAgg(fig)
        return fig
    return save_figure(fig, path)
