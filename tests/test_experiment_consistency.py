"""What compare and sweep print agrees with itself (issue 46): goodput never above the
achieved rate it sits beside, counts printed as integers, and `--set` taken as `run` takes
it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from test_compare import SPEC
from test_sweep import TINY

from sim.cli import main
from sim.experiments.compare import count_text, slo_line
from sim.experiments.sweep import markdown_table


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    path = tmp_path / "compare.yaml"
    path.write_text(SPEC.replace("base: scenarios/", "base: "))
    return path


def test_compare_with_set_goodput_never_above_achieved(
        spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["compare", str(spec), "--jobs", "1", "--no-plots", "--out", str(out),
                 "--set", "workload.num_requests=30"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    table = pd.read_csv(out / "compare.csv")
    assert (table["completed"] == 30).all()  # the --set reached every run
    # the same window's goodput and achieved rate; the whole run's likewise
    assert (table["window_goodput"] <= table["window_throughput"] + 1e-12).all()
    assert (table["request_goodput"] <= table["request_throughput"] + 1e-12).all()
    assert (table["window_throughput_lo"].dropna() >= 0).all()
    slo = pd.read_csv(out / "compare_slo.csv").dropna(subset=["request_goodput"])
    assert len(slo) and (slo["request_goodput"] <= slo["window_throughput"] + 1e-12).all()
    assert "achieved" in stdout and ".0 requests a run" not in stdout
    md = (out / "compare.md").read_text()
    assert "| req/s (window) | goodput (window) |" in md


@pytest.mark.parametrize(("extra", "said"), [
    (["--set", "workload.arrivals.rate=3"], "--set workload.arrivals.rate: the compare sets"),
    (["--set", "scheduler.max_num_seqs=8"], "variant 'whole' sets it too"),
])
def test_compare_refuses_a_set_it_would_override(
        spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
        said: str) -> None:
    assert main(["compare", str(spec), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_sweep_takes_set_for_every_point(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    out = tmp_path / "sweep"
    assert main(["sweep", str(scenario), "--grid", "workload.arrivals.rate=4,8", "--jobs", "1",
                 "--quiet", "--out", str(out), "--set", "workload.num_requests=25"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert table["completed"].tolist() == [25, 25]
    assert (table["request_goodput"].dropna() <= table["request_throughput"] + 1e-12).all()
    assert main(["sweep", str(scenario), "--grid", "workload.num_requests=5,6", "--quiet",
                 "--out", str(tmp_path / "x"), "--set", "workload.num_requests=25"]) == 2
    assert "also a --grid key" in capsys.readouterr().err


def test_counts_print_as_integers() -> None:
    assert count_text(76800.0) == "76,800" and count_text(None) == "n/a"
    row = {"variant": "a", "max_slo_rate": 4.25, "first_failing_rate": 4.5,
           "slo_attainment": 0.99, "slo_attainment_lo": 0.98, "slo_attainment_hi": 1.0,
           "window_throughput": 4.5, "request_goodput": 4.46, "requests": 76800.0,
           "note": math.nan}
    line = slo_line(row)
    assert "76,800 requests a run" in line and "achieved 4.5 req/s, goodput 4.46" in line
    frame = pd.DataFrame({"requests": [76800.0, math.nan], "rate": [4.25, 1.0]})
    assert "| 76800 | 4.25 |" in markdown_table(frame)


def _summary(tmp_path: Path, *sets: str) -> dict:
    out = tmp_path / "run"
    args = ["run", "scenarios/quickstart.yaml", "--no-plots", "--quiet", "--out", str(out)]
    for item in sets:
        args += ["--set", item]
    assert main(args) == 0
    return json.loads((out / "summary.json").read_text())


def test_an_overloaded_batch_servers_rate_is_its_backlogs(tmp_path: Path) -> None:
    """Static batching far over its capacity: its achieved rate is the whole run's, as the
    table's is, not the batch or two that happen to finish before the last arrival."""
    s = _summary(tmp_path, "scheduler.policy=static", "scheduler.batch_size=16",
                 "workload.arrivals.rate=50", "workload.num_requests=400")
    assert not s["sustained"]
    window, rate = s["window"], s["ci95"]["request_throughput"]
    assert window["rates_start_s"] <= window["start_s"] < window["end_s"] < window[
        "rates_end_s"]
    assert rate["estimate"] == pytest.approx(s["request_throughput"], rel=0.15)
    assert rate["estimate"] < 0.5 * window["offered_rate"]  # and still far from keeping up
    good = s["ci95"]["request_goodput"]
    assert good["estimate"] <= rate["estimate"]


def test_intervals_of_rates_and_latencies_never_reach_below_zero(tmp_path: Path) -> None:
    s = _summary(tmp_path, "scheduler.policy=static", "workload.num_requests=30")
    ci = {k: v for k, v in s["ci95"].items() if isinstance(v, dict) and v["lo"] is not None}
    assert ci and all(v["lo"] >= 0 for v in ci.values()), ci
    # a short static run's intervals are wide: uncut, some would reach below 0
    assert any(v["estimate"] - v["half_width"] < 0 for v in ci.values())
