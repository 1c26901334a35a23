"""A run's result directory: its files (sim.results.files.write), then its pictures (sim.plots.run).

Why here: writing is results' job and drawing plots', and only a layer above
both may ask for both. A run that streamed requests.csv into `out_dir` is not
written again; the pictures read back the columns they draw.
"""

from __future__ import annotations

from pathlib import Path

from sim.results.files.run import RunResult
from sim.results.files.write import (
    write_columns,
    write_replicas,
    write_run_files,
    write_timeline,
)


def write_outputs(result: RunResult, out_dir: Path, plots: bool = True) -> list[Path]:
    """Every file of the run, plus (with `plots`) its PNGs; returns the paths written."""
    recorder = result.recorder
    streamed = recorder.streamed_to is not None and Path(recorder.streamed_to).parent.samefile(
        out_dir)  # requests.csv is already there, written as the requests finished
    written = write_run_files(out_dir, result.summary,
                              None if streamed else recorder.requests_frame(),
                              recorder.steps_columns())
    fleet = len(result.replica_recorders) > 1
    if fleet:
        written.append(write_replicas(out_dir, result.summary.get("replicas", [])))
    if result.timeline is not None:
        written.append(write_timeline(out_dir, result.timeline))
    for name, pool in result.pool_recorders:  # a disaggregated fleet: each pool's series
        written.append(write_columns(out_dir / f"timeseries_{name}.csv", pool.steps_columns()))
    if plots:  # matplotlib loads only when pictures are drawn
        from sim.plots.run import plot_run

        replica_series = [r.steps_frame() for r in result.replica_recorders] if fleet else []
        requests = (_plotted_requests(Path(recorder.streamed_to)) if streamed
                    else recorder.requests_frame())
        written += plot_run(out_dir, result.summary, requests,
                            recorder.steps_frame(), replica_series, result.timeline)
    return written


def _plotted_requests(path: Path):  # noqa: ANN202 - a pandas frame; pandas loads here only
    """The columns of a streamed requests.csv the latency CDFs draw, not the whole file."""
    import pandas as pd

    return pd.read_csv(path, usecols=["ttft_ms", "tpot_ms", "status"])
