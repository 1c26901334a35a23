"""`servesim sweep`: grid parsing, the same table on every backend and job count, errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.experiments.sweep import Backend, SweepError, grid_points, parse_grid, sweep

TINY = """\
name: tiny
seed: 3
model: llama-3-8b
workload:
  arrivals: {process: poisson, rate: 4}
  prompt_tokens: {dist: lognormal, mean: 300, cv: 1.0, min: 4, max: 2000}
  output_tokens: {dist: lognormal, mean: 60, cv: 1.0, min: 1, max: 400}
  num_requests: 40
slo: {ttft_ms: 300, tpot_ms: 30}
"""
GRID = {"workload.arrivals.rate": [4, 64], "scheduler.max_num_seqs": [4, 64]}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_parse_grid_values_are_yaml() -> None:
    grid = parse_grid(["a.b=1,2.5,true,x", "c=[1, 2],[3]", "d= null_ish ,7"])
    assert grid == {"a.b": [1, 2.5, True, "x"], "c": [[1, 2], [3]], "d": ["null_ish", 7]}


@pytest.mark.parametrize("item", ["noequals", "=1", "a=", "a.=1", "a=[1", "a=1,,2"])
def test_parse_grid_rejects_bad_syntax(item: str) -> None:
    with pytest.raises(SweepError, match="--grid"):
        parse_grid([item])


def test_parse_grid_rejects_a_repeated_key_and_no_grid() -> None:
    with pytest.raises(SweepError, match="already in the grid"):
        parse_grid(["a=1", "a=2"])
    with pytest.raises(SweepError, match="at least one --grid"):
        parse_grid([])


def test_grid_points_first_key_varies_slowest() -> None:
    assert grid_points({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]


def table(tiny: Path, backend: Backend) -> pd.DataFrame:
    return sweep(tiny, GRID, backend, progress=False).drop(columns=["wall_s"])


def test_same_table_with_one_and_two_jobs(tiny: Path) -> None:
    one = table(tiny, Backend("loky", jobs=1))
    two = table(tiny, Backend("loky", jobs=2))
    pd.testing.assert_frame_equal(one, two)
    assert one[list(GRID)].values.tolist() == [[4, 4], [4, 64], [64, 4], [64, 64]]
    assert (one["completed"] == 40).all()
    # the grid reached the runs: more seats help only under load
    fast = one.set_index(list(GRID))["request_throughput"]
    assert fast[(64, 64)] > 1.5 * fast[(64, 4)]


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                    reason="dask.distributed is not installed (pip install 'servesim[dask]'); "
                           "CI installs it through the test extra")
def test_same_table_on_a_dask_local_cluster(tiny: Path) -> None:
    local = table(tiny, Backend("loky", jobs=1))
    on_dask = table(tiny, Backend("dask", jobs=2))
    pd.testing.assert_frame_equal(local, on_dask)


def test_cli_writes_tables_and_no_plots_unless_asked(tiny: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["sweep", str(tiny), "--grid", "workload.arrivals.rate=4,8", "--jobs", "2",
                 "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "| workload.arrivals.rate |" in stdout
    assert "2 runs (0 reused from .servesim-cache/); results in" in stdout
    frame = pd.read_csv(out / "sweep.csv")
    assert frame["workload.arrivals.rate"].tolist() == [4, 8]
    assert (out / "sweep.md").read_text().startswith("| workload.arrivals.rate |")
    assert not list(out.rglob("*.png"))
    plotted = tmp_path / "plotted"
    assert main(["sweep", str(tiny), "--grid", "seed=1", "--plots", "--quiet",
                 "--out", str(plotted)]) == 0
    assert {p.name for p in (plotted / "runs" / "000").glob("*.png")} == {
        "latency_cdf.png", "timeseries.png"}


ERRORS = {
    "bad grid syntax": (["--grid", "workload.arrivals.rate"], "expected key.path=v1,v2"),
    "bad yaml": (["--grid", "seed=[1"], "not valid YAML"),
    "unknown key": (["--grid", "scheduler.bogus=1,2"], "scheduler.bogus: unknown key"),
    "bad value": (["--grid", "scheduler.max_num_seqs=8,many"], "(got 'many')"),
    "a point fails to run": (["--grid", "model=llama-3-8b,llama-3-70b", "--jobs", "1"],
                             'memory_utilization (grid point model="llama-3-70b")'),
    "bad jobs": (["--grid", "seed=1", "--jobs", "0"], "--jobs must be >= 1"),
    "address without dask": (["--grid", "seed=1", "--scheduler-address", "tcp://x:1"],
                             "only applies to --backend dask"),
}


@pytest.mark.parametrize("argv, expected", ERRORS.values(), ids=ERRORS)
def test_errors_exit_2_with_one_line(tiny: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str], argv: list[str],
                                     expected: str) -> None:
    code = main(["sweep", str(tiny), "--out", str(tmp_path / "out"), "--quiet", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed")
def test_ray_backend_without_ray_is_a_clear_error(tiny: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(tiny), "--grid", "seed=1", "--backend", "ray", "--quiet"]) == 2
    assert "--backend ray needs ray: pip install 'servesim[ray]'" in capsys.readouterr().err
