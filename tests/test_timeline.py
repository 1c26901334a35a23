"""Request timelines and batch-slot timelines: their invariants, the pictures, the commands."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_diagnose import ROOF, run_observed, small_runs

from sim.cli import main
from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import PagedBlockManager
from sim.core.request import Request, RequestState
from sim.core.schedulers import ContinuousScheduler, StaticScheduler
from sim.observe.slots import SlotRecorder
from sim.observe.trace import MARK_KINDS, RUN_KINDS, choose_requests, read_timeline
from sim.plots.slots import slot_use
from sim.plots.timeline import plot_request_timeline
from sim.results.record.recorder import RunRecorder
from sim.world.fleet import simulate

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_runs())
def test_segments_tile_the_request_and_count_its_tokens(run: tuple) -> None:
    requests, sched = run
    _, observer = run_observed(requests, sched, frozenset(r.request_id for r in requests))
    timeline = observer.tracer.frame()
    groups = {int(rid): rows for rid, rows in timeline.groupby("request_id")}
    for req in requests:
        if req.state is not RequestState.FINISHED:
            assert req.request_id not in groups  # rejected: never admitted, no timeline
            continue
        rows = groups[req.request_id]
        kinds = rows["kind"].to_numpy()
        start, end = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        mark = np.isin(kinds, MARK_KINDS)
        assert start[kinds == "first_token"].tolist() == [req.first_token_s]
        assert start[kinds == "finish"].tolist() == [req.finish_s]
        kinds, start, end = kinds[~mark], start[~mark], end[~mark]
        new, emits = rows["new_tokens"].to_numpy()[~mark], rows["emits"].to_numpy()[~mark]
        # from arrival to finish, back to back: never overlapping, never a hole
        assert start[0] == req.arrival_s and end[-1] == req.finish_s
        assert (end > start).all() and (start[1:] == end[:-1]).all()
        assert int(emits[np.isin(kinds, RUN_KINDS)].sum()) == req.output_tokens
        prefill = kinds == "prefill"
        # the first token ends a prefill segment, or a recompute one when the request was
        # preempted before it (its re-prefill is drawn as recomputation)
        first = (end == req.first_token_s) & np.isin(kinds, ("prefill", "recompute"))
        assert emits[first].sum() == 1 and emits[first][-1]
        decodes = int((kinds == "decode").sum())
        if req.num_preemptions == 0:
            assert decodes == req.output_tokens - 1
            assert new[prefill].sum() == req.prompt_tokens - req.prefix_hit_tokens
        else:
            assert decodes <= req.output_tokens - 1


@given(st.integers(1, 300), st.integers(0, 40))
def test_choose_requests_spreads_over_the_run(count: int, n: int) -> None:
    ids = list(range(1000, 1000 + count))
    chosen = sorted(choose_requests(ids, n))
    assert chosen == sorted(choose_requests(ids, n))  # deterministic
    assert len(chosen) == min(n, count) and set(chosen) <= set(ids)
    if n >= 2 and count >= n:
        assert chosen[0] == ids[0] and chosen[-1] == ids[-1]
        gaps = np.diff(chosen)
        assert gaps.max() - gaps.min() <= 1  # evenly spread


def test_choose_requests_rejects_a_negative_count() -> None:
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        choose_requests([1, 2], -1)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=14))
def test_slots_static_pads_and_continuous_refills(outputs: list[int]) -> None:
    """The same burst on 4 slots: static pads to 4, continuous never pads, both stay in 4."""
    def burst() -> list[Request]:
        return [Request(i, 0.0, 64, out) for i, out in enumerate(outputs)]

    static, cont = SlotRecorder(10_000), SlotRecorder(10_000)
    simulate(burst(), StaticScheduler(ContiguousAllocator(400, 16, 0.0), 4, max_model_len=256),
             ROOF, RunRecorder(), observer=static)
    simulate(burst(), ContinuousScheduler(PagedBlockManager(400, 16, 0.0), 4, 512), ROOF,
             RunRecorder(), observer=cont)
    for rec in (static, cont):
        for _, _, cells in rec.steps:
            slots = [slot for slot, _, _ in cells]
            assert len(slots) == len(set(slots)) and max(slots) < 4
    assert all(len(cells) == 4 for _, _, cells in static.steps)  # every step runs over B
    for rec in (static, cont):  # each request works in one prefill step and output-1 decodes
        assert slot_use(rec, 4) == pytest.approx(sum(outputs) / (4 * len(rec.steps)))
    assert not any(kind == "padded" for _, _, cells in cont.steps for _, _, kind in cells)

    def steps_with_a_waiter(rec: SlotRecorder) -> list[list[tuple[int, int, str]]]:
        first: dict[int, int] = {}
        for j, (_, _, cells) in enumerate(rec.steps):
            for _, rid, _ in cells:
                first.setdefault(rid, j)
        return [cells for j, (_, _, cells) in enumerate(rec.steps)
                if any(k > j for k in first.values())]

    # continuous refills a freed slot at the next step while anyone waits; static pads it
    assert all(len(cells) == 4 for cells in steps_with_a_waiter(cont))
    if len(outputs) > 4 and len(set(outputs[:4])) > 1:
        assert any(kind == "padded" for cells in steps_with_a_waiter(static)
                   for _, _, kind in cells)


def test_run_timeline_and_redraw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", str(QUICKSTART), "--quiet", "--no-plots", "--out", str(out),
                 "--timeline", "4", "--set", "workload.num_requests=60"]) == 0
    assert not (out / "timeline.png").exists()  # --no-plots: the CSV only
    assert main(["plot", "timeline", str(out)]) == 0
    assert (out / "timeline.png").stat().st_size > 0
    timeline = read_timeline(out / "timeline.csv")
    assert set(timeline["request_id"]) == choose_requests(range(60), 4)
    requests = pd.read_csv(out / "requests.csv").set_index("request_id")
    assert (requests["preemptions"] == 0).all()  # the quickstart pool is roomy
    for rid, rows in timeline.groupby("request_id"):
        assert int((rows["kind"] == "decode").sum()) == requests.loc[rid, "output_tokens"] - 1
    picked = sorted(timeline["request_id"].unique())[:2]
    redraw = tmp_path / "two.png"
    assert main(["plot", "timeline", str(out), "--requests", ",".join(map(str, picked)),
                 "--out", str(redraw)]) == 0
    assert redraw.stat().st_size > 0
    capsys.readouterr()
    for argv, message in (
            (["plot", "timeline", str(out), "--requests", "5000"], "were not traced"),
            (["plot", "timeline", str(out), "--requests", "x"], "--requests: expected"),
            (["plot", "timeline", str(tmp_path)], "no timeline here"),
            (["run", str(QUICKSTART), "--timeline", "-1"], "--timeline: must be >= 0")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_plot_slots_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "slots.png"
    assert main(["plot", "slots", str(QUICKSTART), "--requests", "12", "--steps", "60",
                 "--slots", "4", "--policies", "static,dynamic,continuous",
                 "--set", "workload.output_tokens.max=200", "--out", str(png)]) == 0
    assert png.stat().st_size > 0
    timed = tmp_path / "timed.png"
    assert main(["plot", "slots", "--requests", "6", "--steps", "30", "--arrivals", "scenario",
                 "--x", "time", "--mean-output", "0", "--out", str(timed)]) == 0
    assert timed.stat().st_size > 0
    capsys.readouterr()
    for argv, message in ((["--policies", "static,fifo"], "--policies: 'static,fifo'"),
                          (["--steps", "0"], "--steps: must be >= 1, got 0"),
                          (["--mean-output", "-1"], "--mean-output: must be >= 0"),
                          (["--set", "scheduler.max_num_seqs=many"], "scheduler.max_num_seqs")):
        assert main(["plot", "slots", str(QUICKSTART), "--out", str(png), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_timeline_figure_for_notebooks() -> None:
    requests = [Request(i, 0.01 * i, 100, 8) for i in range(6)]
    _, observer = run_observed(requests, ContinuousScheduler(PagedBlockManager(200, 16, 0.0),
                                                             4, 128), frozenset([1, 4]))
    frame = observer.tracer.frame()
    fig = plot_request_timeline(frame, requests=[4])
    assert len(fig.axes) == 2 and [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        "req 4"]
    with pytest.raises(ValueError, match=r"requests \[2\] were not traced"):
        plot_request_timeline(frame, requests=[2, 4])
    assert np.isclose(frame["end_s"].max(), max(r.finish_s for r in requests if r.request_id
                                                in (1, 4)))
