"""Every run's summary: its measurement window, ci95 block and sustained verdict."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.config.loader import load_scenario
from sim.experiments.run import run_scenario
from sim.results.files.report import format_summary, jsonable
from sim.results.files.steady import ci_keys


def _summary(rate: float, n: int = 600, *sets: str) -> dict:
    scenario, base_dir = load_scenario("scenarios/quickstart.yaml", [
        f"workload.arrivals.rate={rate}", f"workload.num_requests={n}", *sets])
    return jsonable(run_scenario(scenario, base_dir, show_progress=False).summary)


@pytest.fixture(scope="module")
def light() -> dict:
    return _summary(4.0)


@pytest.fixture(scope="module")
def overloaded() -> dict:
    return _summary(32.0)


def test_summary_has_window_ci95_and_verdict(light: dict) -> None:
    w = light["window"]
    assert w["excluded_start"] + w["excluded_end"] + w["requests"] == 600
    assert 0 <= w["start_s"] < w["end_s"]
    assert set(ci_keys(with_slo=True)) <= set(light["ci95"])
    for key in ci_keys(with_slo=True):
        ci = light["ci95"][key]
        assert ci["lo"] <= ci["estimate"] <= ci["hi"], key
    assert light["ci95"]["p99_ttft_ms"]["estimate"] >= light["ci95"]["median_ttft_ms"]["estimate"]
    assert light["sustained"] is True
    # achieved within the window brackets the offered rate (4 req/s, Poisson)
    tput = light["ci95"]["request_throughput"]
    assert tput["lo"] <= w["offered_rate"] <= tput["hi"]


def test_overload_is_not_sustained_and_says_transient(overloaded: dict) -> None:
    assert overloaded["sustained"] is False
    checks = overloaded["sustained_checks"]
    assert not checks["keeps_up"] and checks["upward_trend"]
    text = format_summary(overloaded)
    assert "(transient)" in text and "NOT sustained" in text.splitlines()[-1]


def test_light_load_text_is_not_transient(light: dict) -> None:
    text = format_summary(light)
    assert "transient" not in text
    assert text.splitlines()[-1].startswith("Window ") and "; sustained" in text


def test_same_scenario_and_seed_same_statistics(light: dict) -> None:
    again = _summary(4.0)
    for key in ("window", "ci95", "sustained", "sustained_checks"):
        assert json.dumps(again[key], sort_keys=True) == json.dumps(light[key], sort_keys=True)


def test_replications_pool_their_estimates_deterministically() -> None:
    from sim.experiments.replicate import replicate, replication_seeds
    from sim.experiments.sweep import Backend
    from sim.results.stats.intervals import spread_interval

    seeds = replication_seeds(0, 3)
    assert seeds[0] == 0 and len(set(seeds)) == 3 and seeds == replication_seeds(0, 3)
    assert replication_seeds(1, 3)[1:] != seeds[1:]
    scenario, base_dir = load_scenario("scenarios/quickstart.yaml", [
        "workload.arrivals.rate=4", "workload.num_requests=300"])
    result, pooled = replicate(scenario, base_dir, 3, Backend(jobs=1), show_progress=False)
    runs = pooled["replication_runs"]
    assert [r["seed"] for r in runs] == seeds
    expected = spread_interval(np.array([r["request_throughput"] for r in runs]))
    got = pooled["ci95"]["request_throughput"]
    assert got["estimate"] == pytest.approx(expected.estimate)
    assert got["half_width"] == pytest.approx(expected.half_width)
    assert pooled["ci95"]["method"] == "independent replications"
    assert len({r["request_throughput"] for r in runs}) == 3  # the seeds differ
    _, again = replicate(scenario, base_dir, 3, Backend(jobs=1), show_progress=False)
    assert json.dumps(jsonable(again), sort_keys=True) == json.dumps(jsonable(pooled),
                                                                     sort_keys=True)
    single, nothing = replicate(scenario, base_dir, 1, show_progress=False)
    assert nothing == {} and single.summary["ci95"]["method"] == "batch means"


def test_bad_replications_exit_2_before_any_work(tmp_path, capsys) -> None:
    from sim.cli import main

    out = tmp_path / "out"
    assert main(["run", "scenarios/quickstart.yaml", "--replications", "0",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--replications" in err and "got 0" in err and "Traceback" not in err
    assert not out.exists()
