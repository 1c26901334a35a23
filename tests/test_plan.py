"""`servesim plan`: capacity math prunes, simulation decides, the cheapest passing fleet wins."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.config.catalogue import get_hardware, get_model
from sim.config.loader import load_scenario
from sim.experiments.plan import Search, candidates, cost_of, judge, replica_bound_rps
from sim.experiments.run import run_scenario

PLAN_SCENARIO = """\
name: tinyplan
seed: 1
model: llama-3-8b
workload:
  arrivals: {process: poisson, rate: 1.0}
  prompt_tokens: {dist: lognormal, mean: 400, cv: 1.0, min: 4, max: 2000}
  output_tokens: {dist: lognormal, mean: 80, cv: 1.0, min: 1, max: 400}
  num_requests: 200
slo: {ttft_ms: 1000, tpot_ms: 50}
"""


def test_capacity_math_prunes_what_cannot_fit() -> None:
    model = get_model("llama-3-70b")
    found = {(c.gpu, c.tp): c for c in candidates(
        model, {"h100-sxm": get_hardware("h100-sxm"), "h200": get_hardware("h200")},
        (1, 3, 4), rate=40.0, longest_tokens=8000, mean_prompt=1000, mean_output=200)}
    assert not found[("h100-sxm", 1)].fits and "KV room" in found[("h100-sxm", 1)].reason
    assert not found[("h100-sxm", 3)].fits  # 64 heads do not split 3 ways
    four = found[("h100-sxm", 4)]
    assert four.fits and four.min_replicas * four.bound_rps >= 40.0
    assert (four.min_replicas - 1) * four.bound_rps < 40.0
    assert found[("h200", 4)].bound_rps >= four.bound_rps  # more HBM bandwidth and room


def test_the_replica_bound_is_never_beaten_by_the_simulator() -> None:
    scenario, base_dir = load_scenario(None, ["workload.arrivals.rate=200",
                                              "workload.num_requests=2000"])
    summary = run_scenario(scenario, base_dir, show_progress=False).summary
    r = run_scenario(scenario, base_dir, show_progress=False).recorder.request_arrays()
    bound = replica_bound_rps(scenario.model_spec, scenario.hardware_spec, 1,
                              float(r["prompt_tokens"].mean()), float(r["output_tokens"].mean()),
                              0.9, 256, 8192)
    achieved = summary["ci95"]["request_throughput"]["estimate"]
    assert not summary["sustained"]  # saturated: the achieved rate is its capacity
    assert achieved <= bound


def test_judge_needs_sustained_and_the_percentiles_within_bounds() -> None:
    ok = {"sustained": True, "ci95": {"p99_ttft_ms": {"estimate": 900.0},
                                      "p99_tpot_ms": {"estimate": 40.0}}}
    assert judge(ok, 1000.0, 50.0).passes
    assert not judge({**ok, "sustained": False}, 1000.0, 50.0).passes
    assert "TTFT" in judge(ok, 800.0, 50.0).why
    assert judge(ok, None, 50.0).passes and not judge(ok, None, 30.0).passes
    assert cost_of("h200", 4, {}) == 4.0 and cost_of("h200", 4, {"h200": 3.5}) == 14.0


def test_search_jumps_by_the_shortfall_and_stops_at_the_answer() -> None:
    search = Search({("g", 1): 2}, max_replicas=10)
    assert search.round() == [("g", 1, 2)]
    search.record("g", 1, 2, {"shortfall": 0.5}, passed=False)  # half the rate: double
    assert search.round() == [("g", 1, 4)]
    search.record("g", 1, 4, {"shortfall": 0.99}, passed=False)
    assert search.round() == [("g", 1, 5)]
    search.record("g", 1, 5, {}, passed=True)
    assert search.round() == [] and search.answer == {("g", 1): 5}


def test_plan_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tinyplan.yaml"
    scenario.write_text(PLAN_SCENARIO)
    out = tmp_path / "out"
    code = main(["plan", str(scenario), "--rate", "20", "--gpu", "h100-sxm", "--tp", "1,2",
                 "--requests", "300", "--jobs", "1", "--out", str(out),
                 "--price", "h100-sxm=2.5"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert stdout.startswith("Cheapest for 20 req/s") and "planned in" in stdout
    table = pd.read_csv(out / "plan.csv")
    assert (table["passes"]).all() and table["cost"].is_monotonic_increasing
    assert table["cost"].tolist() == (table["gpus"] * 2.5).tolist()
    tried = pd.read_csv(out / "tried.csv")
    for row in table.itertuples():  # the answer per candidate is its least passing count
        fewer = tried[(tried.gpu == row.gpu) & (tried.tp == row.tp)
                      & (tried.replicas < row.replicas)]
        assert not fewer["passes"].any()
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plan", str(scenario), "--rate", "20", "--gpu", "h100-sxm", "--tp", "1,2",
                 "--requests", "300", "--jobs", "1", "--out", str(out),
                 "--price", "h100-sxm=2.5"]) == 0
    assert f"{len(tried)} from the cache" in capsys.readouterr().out  # resumable too


@pytest.mark.parametrize(("extra", "said"), [
    (["--rate", "0"], "--rate"), (["--rate", "5", "--gpu", "nonesuch"], "nonesuch"),
    (["--rate", "5", "--gpu", "h100-sxm,h200", "--price", "h200=3"], "--price"),
    (["--rate", "5", "--tp", "two"], "--tp")])
def test_plan_bad_input_exits_2_before_any_work(tmp_path: Path, extra: list[str], said: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tinyplan.yaml"
    scenario.write_text(PLAN_SCENARIO)
    out = tmp_path / "out"
    assert main(["plan", str(scenario), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not out.exists()
