"""requests.csv streamed as requests finish: the same file and summary as the in-memory path,
no Request kept alive, no pandas on a run without plots."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from sim.config.loader import load_scenario
from sim.core.request import Request, RequestState
from sim.experiments.run import run_scenario
from sim.results.record.recorder import RunRecorder
from sim.results.record.requests import RequestCSV
from sim.results.stats.sketch import DEFAULT_RELATIVE_ERROR

CASES = {
    "plain": [],
    "rejections": ["scheduler.max_model_len=2048"],
    "speculative": ["speculative.num_tokens=3"],
    "fleet": ["replicas=2"],
}


def _runs(sets: list[str], tmp_path):  # noqa: ANN001, ANN202
    scenario, base_dir = load_scenario("scenarios/quickstart.yaml",
                                       ["workload.num_requests=120", *sets])
    kept = run_scenario(scenario, base_dir, show_progress=False)
    path = tmp_path / "requests.csv"
    streamed = run_scenario(scenario, base_dir, show_progress=False, requests_csv=path)
    return kept, streamed, path


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_file_and_summary_equal_the_in_memory_run(case, tmp_path) -> None:
    kept, streamed, path = _runs(CASES[case], tmp_path)
    frame = kept.recorder.requests_frame()
    text = path.read_text()
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    if frame["status"].eq("finished").all():  # byte for byte what pandas writes
        assert text == buf.getvalue()
    else:  # a row without TTFT parts: pandas prints the integer columns as floats
        assert (frame["status"] == "rejected").sum() > 0
        buf.seek(0)
        pd.testing.assert_frame_equal(pd.read_csv(path), pd.read_csv(buf), check_dtype=False)
    drop = ("simulation_wall_s",)
    assert ({k: v for k, v in streamed.summary.items() if k not in drop}
            == {k: v for k, v in kept.summary.items() if k not in drop}) or _nan_equal(
        streamed.summary, kept.summary, drop)


def _nan_equal(a: dict, b: dict, drop: tuple[str, ...]) -> bool:
    return pd.Series({k: str(v) for k, v in a.items() if k not in drop}).equals(
        pd.Series({k: str(v) for k, v in b.items() if k not in drop}))


def test_a_streaming_recorder_keeps_no_request_alive(tmp_path) -> None:
    rec = RunRecorder(rows=RequestCSV(tmp_path / "r.csv", speculation=False))
    for i in range(50):
        req = Request(i, i * 0.1, 8, 4)
        req.state, req.first_scheduled_s, req.first_token_s = RequestState.FINISHED, i * 0.1, \
            i * 0.1 + 0.05
        req.finish_s = i * 0.1 + 0.2
        before = sys.getrefcount(req)
        rec.record_finished(req)
        assert sys.getrefcount(req) == before  # nothing of the recorder points at it
    rec.close()
    assert rec.num_requests == 50 and len(pd.read_csv(tmp_path / "r.csv")) == 50
    with pytest.raises(ValueError, match="keeps no request rows"):
        rec.request_arrays()


def test_a_run_without_plots_imports_no_pandas(tmp_path) -> None:
    code = ("import sys; from sim.cli import main; "
            f"rc = main(['run', 'scenarios/quickstart.yaml', '--no-plots', '--quiet', "
            f"'--set', 'workload.num_requests=50', '--out', {str(tmp_path / 'out')!r}]); "
            "assert rc == 0, rc; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert len(pd.read_csv(tmp_path / "out" / "requests.csv")) == 50


def test_run_percentiles_are_within_the_sketch_bound_of_numpys(tmp_path) -> None:
    kept, _, _ = _runs([], tmp_path)
    frame, s = kept.recorder.requests_frame(), kept.summary
    for metric in ("ttft", "tpot", "e2el", "queue"):
        values = frame[f"{metric}_ms"].dropna().to_numpy()
        assert s[f"mean_{metric}_ms"] == pytest.approx(values.mean(), rel=1e-12)
        for stat, q in (("median", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
            exact = np.percentile(values, q)
            assert abs(s[f"{stat}_{metric}_ms"] - exact) <= (
                DEFAULT_RELATIVE_ERROR + 1e-12) * exact
