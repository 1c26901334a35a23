"""Timeline pictures: a Gantt chart of traced requests, and batch slots over time.

The request Gantt draws each traced request on its own row, time measured
from its arrival: waiting, each prefill chunk, each decode step, preemption
and recomputation, with its first token and finish marked; the left panel
zooms on the time to first token. The slot picture runs the same requests
under several batching policies with the same number of slots and shows who
occupies which slot at each step, padded and empty slots included: the
one-picture explanation of continuous batching. Plain matplotlib (Agg).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.config.scenario import Scenario
from sim.core.plan import StepPlan
from sim.core.request import Request
from sim.des import simulate
from sim.metrics import RunRecorder
from sim.plots import save_figure
from sim.run import build_block_manager, build_latency, build_scheduler, kv_budget
from sim.trace import MARK_KINDS, RUN_KINDS, WAIT_KINDS
from sim.workload import make_requests

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
    """Gantt chart of `frame` (sim.trace's timeline), one row per request; saved to `path`
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


class SlotRecorder:
    """Who holds which batch slot at each of the first `max_steps` steps (an observer).

    A request takes the lowest free slot when it first appears in a plan and
    keeps it until it finishes or is preempted; a held slot it gets no tokens
    in is `stalled`; a step's padding (`padded_batch` beyond its sequences)
    fills the lowest free slots.
    """

    def __init__(self, max_steps: int = 200) -> None:
        self.max_steps = max_steps
        self.steps: list[tuple[float, float, list[tuple[int, int, str]]]] = []
        self._requests: dict[int, Request] = {}
        self._slot_of: dict[int, int] = {}
        self._free: list[int] = []
        self._next = 0

    def on_arrival(self, request: Request, now_s: float) -> None:
        if len(self.steps) < self.max_steps:
            self._requests[request.request_id] = request

    def _take(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next += 1
        return self._next - 1

    def on_step(self, start_s: float, duration_s: float, plan: StepPlan) -> None:
        if len(self.steps) >= self.max_steps:
            return
        for rid, slot in list(self._slot_of.items()):
            if self._requests[rid].finish_s is not None or rid in plan.preempted_ids:
                del self._slot_of[rid]
                heapq.heappush(self._free, slot)
        cells = []
        for rid, prefill in zip(plan.request_ids, plan.is_prefill, strict=True):
            slot = self._slot_of.get(rid)
            if slot is None:
                slot = self._slot_of[rid] = self._take()
            cells.append((slot, rid, "prefill" if prefill else "decode"))
        in_plan = set(plan.request_ids)
        cells += [(slot, rid, "stalled") for rid, slot in self._slot_of.items()
                  if rid not in in_plan]
        taken = [self._take() for _ in range(max(0, plan.shape.padded_batch - plan.batch_size))]
        cells += [(slot, -1, "padded") for slot in taken]
        for slot in taken:
            heapq.heappush(self._free, slot)
        self.steps.append((start_s, duration_s, cells))

    @property
    def num_slots(self) -> int:
        return self._next

    @property
    def num_finished(self) -> int:
        """Requests that finished within the recorded steps."""
        end_s = self.steps[-1][0] + self.steps[-1][1] if self.steps else 0.0
        return sum(r.finish_s is not None and r.finish_s <= end_s and r.first_token_s is not None
                   for r in self._requests.values())


def record_slots(scenario: Scenario, policy: str, slots: int = 8, num_requests: int = 40,
                 max_steps: int = 200, burst: bool = True, mean_output_tokens: float = 20.0,
                 base_dir: Path | None = None) -> SlotRecorder:
    """Simulate the scenario's first `num_requests` requests under `policy` with `slots`
    batch slots (static/dynamic batch_size, continuous max_num_seqs).

    `burst` makes them all arrive at 0, a backlog that shows how each policy refills
    its slots; `mean_output_tokens` > 0 scales the output lengths to that mean, keeping
    their spread, so that a few hundred steps show several batches (0: as drawn).
    """
    cfg = scenario.scheduler.model_copy(update={
        "policy": policy, "batch_size": slots, "max_num_seqs": slots,
        "max_num_batched_tokens": max(slots, scenario.scheduler.max_num_batched_tokens),
        **({} if policy == "continuous" else {"preemption": "recompute"})})
    kv = scenario.kv.model_copy(update={"mode": None, **(
        {} if policy == "continuous" else {"prefix_caching": False})})
    one = scenario.model_copy(update={"scheduler": cfg, "kv": kv, "replicas": 1})
    requests = list(islice(make_requests(one.workload, one.seed, base_dir), num_requests))
    scale = 0.0
    if mean_output_tokens > 0 and requests:
        scale = mean_output_tokens / float(np.mean([r.output_tokens for r in requests]))
    requests = [replace(r, arrival_s=0.0 if burst else r.arrival_s, output_tokens=max(
        1, round(r.output_tokens * scale)) if scale else r.output_tokens) for r in requests]
    pool = build_block_manager(one, kv_budget(one))
    recorder = SlotRecorder(max_steps)
    simulate(requests, build_scheduler(one, pool), build_latency(one, base_dir), RunRecorder(),
             observer=recorder)
    return recorder


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
        ax.set_title(f"{policy}: {len(rec.steps)} steps, slot use {slot_use(rec, num_slots):.0%}"
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
