"""A run's result directory: its files (sim.results.files), then its pictures (sim.plots.run).

Why here: writing is results' job and drawing plots', and only a layer above
both may ask for both. The requests and time-series frames are built once and
handed to both.
"""

from __future__ import annotations

from pathlib import Path

from sim.results.files import write_replicas, write_run_files, write_timeline
from sim.results.run import RunResult


def write_outputs(result: RunResult, out_dir: Path, plots: bool = True) -> list[Path]:
    """Every file of the run, plus (with `plots`) its PNGs; returns the paths written."""
    requests, series = result.recorder.requests_frame(), result.recorder.steps_frame()
    written = write_run_files(out_dir, result.summary, requests, series)
    fleet = len(result.replica_recorders) > 1
    if fleet:
        written.append(write_replicas(out_dir, result.summary.get("replicas", [])))
    if result.timeline is not None:
        written.append(write_timeline(out_dir, result.timeline))
    if plots:  # matplotlib loads only when pictures are drawn
        from sim.plots.run import plot_run

        replica_series = [r.steps_frame() for r in result.replica_recorders] if fleet else []
        written += plot_run(out_dir, result.summary, requests, series, replica_series,
                            result.timeline)
    return written
