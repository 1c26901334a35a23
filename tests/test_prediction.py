"""Prediction intervals (noise + model error): the law's fit, the combination, the domain, and
coverage on synthetic truth, where "reality" is the simulator with its step time perturbed.

The synthetic check: a scenario with a fixed step time is simulated once per step multiplier
on a grid; a "real server" of a model the fit never saw is the simulator at a multiplier
drawn log-normally (a per-model part and a per-stage part), read off that grid. Laws fitted
on held-out "models" must then cover new models' stages at their stated rate, within
binomial error (4 standard deviations, so a correct law fails about once in 30,000 draws).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.results.stats.model_error import (
    DESCRIPTION_FILE,
    Residual,
    describe,
    load_description,
    split_p_value,
)
from sim.results.stats.prediction import (
    Domain,
    coverage_of,
    interval,
    outside,
    prediction_block,
    upper,
)

MULTIPLIERS = np.exp(np.linspace(-0.5, 0.5, 11))


def _residuals(rng: np.random.Generator, models: int, bias: float, between: float,
               within: float, curve: np.ndarray | None = None, first: int = 0
               ) -> list[Residual]:
    """Two stages per model (light and near saturation) with log error -ln(real / predicted):
    the real server the simulator at a drawn step multiplier (through `curve`: the
    simulator's ln TPOT against ln multiplier, rebased to 0 at 1) or the multiplier itself."""
    out = []
    for j in range(models):
        b = rng.normal(bias, between)
        for stage, occupancy in enumerate((0.2, 0.7)):
            ln_f = b + rng.normal(0.0, within)
            real = np.interp(ln_f, np.log(MULTIPLIERS), curve) if curve is not None else ln_f
            out.append(Residual(f"m{first + j}@{stage}", f"m{first + j}", 2, 1.0, True,
                                occupancy, {"tpot": -float(real)}))
    return out


@pytest.fixture(scope="module")
def tpot_curve() -> np.ndarray:
    """ln(mean TPOT) of a light-load fixed-step run at each multiplier, minus its value at 1."""
    from sim.config.loader import validate_scenario
    from sim.experiments.run import run_scenario

    values = []
    for f in MULTIPLIERS:
        scenario = validate_scenario({
            "latency": {"model": "fixed", "step_ms": 10.0 * float(f)},
            "workload": {"arrivals": {"process": "poisson", "rate": 4.0},
                         "prompt_tokens": {"dist": "fixed", "value": 64},
                         "output_tokens": {"dist": "fixed", "value": 32},
                         "num_requests": 300}}, "synthetic truth")
        values.append(run_scenario(scenario, show_progress=False).summary["mean_tpot_ms"])
    logs = np.log(values)
    return logs - np.interp(0.0, np.log(MULTIPLIERS), logs)


def _coverage(rng: np.random.Generator, curve: np.ndarray, bias: float, between: float,
              within: float, level: float, trials: int) -> tuple[float, float]:
    """Share of new models' stages inside the two-sided `level` interval and under the
    one-sided `level` upper bound, the law fitted on 4 other models each time."""
    inside = below = total = 0
    d = Domain("h100-sxm", 2, 0.2)
    for _ in range(trials):
        law = describe(_residuals(rng, 4, bias, between, within, curve), "tpot")
        assert law is not None
        for r in _residuals(rng, 1, bias, between, within, curve, first=99):
            inside += bool(coverage_of(law, r, "tpot", level))
            real = math.exp(-r.log_errors["tpot"])  # the prediction is 1
            d = Domain("h100-sxm", r.tp, r.occupancy)
            below += real <= upper(1.0, 1e-9, 20, law, d, level)  # type: ignore[operator]
            total += 1
    return inside / total, below / total


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), bias=st.floats(-0.2, 0.2),
       between=st.floats(0.02, 0.15), within=st.floats(0.0, 0.05),
       level=st.sampled_from([0.8, 0.9, 0.95]))
def test_intervals_cover_perturbed_simulator_truth_at_their_stated_rate(
        tpot_curve: np.ndarray, seed: int, bias: float, between: float, within: float,
        level: float) -> None:
    trials = 300  # 600 held-out stages
    two_sided, one_sided = _coverage(np.random.default_rng(seed), tpot_curve, bias, between,
                                     within, level, trials)
    sd = math.sqrt(level * (1 - level) / (2 * trials))
    assert abs(two_sided - level) <= 4 * sd + 0.01, (two_sided, level)
    assert abs(one_sided - level) <= 4 * sd + 0.01, (one_sided, level)


def test_the_perturbed_simulator_moves_tpot_with_its_step_time(tpot_curve: np.ndarray) -> None:
    """The synthetic reality is not the identity: TPOT follows the step multiplier."""
    slope = np.polyfit(np.log(MULTIPLIERS), tpot_curve, 1)[0]
    assert 0.8 < slope < 1.2


def test_a_law_without_the_model_level_spread_undercovers() -> None:
    """Why models, not stages, are the unit: treating 8 correlated stages as independent
    (within scale only) covers new models far less often than stated."""
    rng = np.random.default_rng(1)
    hits = total = 0
    for _ in range(300):
        law = describe(_residuals(rng, 4, 0.0, 0.1, 0.01), "tpot")
        assert law is not None
        for r in _residuals(rng, 1, 0.0, 0.1, 0.01, first=99):
            hits += abs(r.log_errors["tpot"] - law.law(r.tp, r.occupancy)[0]) <= (
                2.0 * law.scale_within)
            total += 1
    assert hits / total < 0.5


def test_interval_reduces_to_the_noise_when_the_model_is_exact() -> None:
    """An exact model leaves the noise, on the smaller degrees of freedom (the law's 3):
    the ci95's standard error (half-width / t_19) times t_3, on the log scale."""
    from sim.results.stats.student_t import t_ppf

    law = describe([Residual(f"m{i}", f"m{i}", 1, 1.0, True, 0.1, {"tpot": 0.0})
                    for i in range(4)], "tpot")
    assert law is not None and law.scale_between == 0 and law.dof == 3
    lo, hi = interval(100.0, 2.0, 20, law, Domain("h100-sxm", 1, 0.1))  # type: ignore[misc]
    half = t_ppf(0.975, 3) * 2.0 / t_ppf(0.975, 19) / 100.0
    assert lo == pytest.approx(100.0 * math.exp(-half)) and hi == pytest.approx(
        100.0 * math.exp(half))
    assert hi - lo > 4.0  # never narrower than the ci95 itself


def test_bias_moves_the_interval_against_the_error() -> None:
    """A simulator that over-predicts by 10% puts the truth below its estimate."""
    law = describe([Residual(f"m{i}", f"m{i}", 1, 1.0, True, 0.1,
                             {"tpot": math.log(1.1) + 0.01 * (i % 2)}) for i in range(4)],
                   "tpot")
    assert law is not None
    lo, hi = interval(110.0, 0.1, 20, law, Domain("h100-sxm", 1, 0.1))  # type: ignore[misc]
    assert lo < 100.0 < hi < 110.0


def test_a_split_needs_models_to_separate_it() -> None:
    tp1 = [Residual(f"a{i}", f"a{i}", 1, 1.0, True, 0.1, {"tpot": 0.0 + 0.01 * i})
           for i in range(3)]
    tp2 = [Residual(f"b{i}", f"b{i}", 2, 1.0, True, 0.1, {"tpot": 0.3 + 0.01 * i})
           for i in range(3)]
    law = describe(tp1 + tp2, "tpot")
    assert law is not None and law.split == "tp" and set(law.regimes) == {"tp1", "tp>1"}
    assert math.isnan(split_p_value(tp1[:1] + tp2, "tpot", lambda tp, o: str(tp)))
    assert describe(tp1[:2], "tpot") is None  # two models: no law


def test_outside_the_validated_domain_there_is_no_interval() -> None:
    table = load_description()
    ci = {"p99_ttft_ms": {"estimate": 100.0, "half_width": 5.0, "n": 20, "lo": 95, "hi": 105}}
    ok = prediction_block(ci, Domain("h100-sxm", 1, 0.2), table)
    assert ok["validated"] and ok["p99_ttft_ms"]["lo"] is not None
    for d, word in ((Domain("b200", 1, 0.2), "b200"),
                    (Domain("h100-sxm", 1, 0.2, speculative_tokens=4), "speculative"),
                    (Domain("h100-sxm", 1, 0.2, mean_context_tokens=9000), "context"),
                    (Domain("h100-sxm", 8, 0.2, expert_parallel=8), "expert"),
                    (Domain("h100-sxm", 1, 0.2, sustained=False), "sustained")):
        block = prediction_block(ci, d, table)
        assert not block["validated"] and block["p99_ttft_ms"]["lo"] is None
        assert any(word in r for r in outside(d)), outside(d)


def test_the_shipped_description_names_its_provenance_and_fits_every_headline_metric() -> None:
    shipped = json.loads(DESCRIPTION_FILE.read_text())
    prov = shipped["provenance"]
    assert prov["fit"]["file"] == "calibrate/serving_fit.json" and len(prov["fit"]["sha256"]) == 64
    assert len(prov["runs"]) == 8 and prov["date"]
    assert {"ttft_p50", "ttft_p99", "tpot", "e2e_mean"} <= set(shipped["metrics"])


def test_the_shipped_description_is_the_record_refitted() -> None:
    """calibrate/model_error.json's residuals, refitted, give the shipped laws."""
    from calibrate.model_error import RECORD_FILE

    record = json.loads(RECORD_FILE.read_text())
    residuals = [Residual.from_dict(d) for d in record["residuals"]]
    for metric, law in load_description().metrics.items():
        refit = describe(residuals, metric)
        assert refit is not None and refit.split == law.split
        assert refit.scale_between == pytest.approx(law.scale_between)
        assert refit.regimes == law.regimes


def _summary(p99_tpot_ms: float, validated: bool = True, gpu: str = "h100-sxm"
             ) -> dict[str, Any]:
    d = Domain(gpu, 1, 0.2)
    ci = {"p99_tpot_ms": {"estimate": p99_tpot_ms, "half_width": 0.01 * p99_tpot_ms, "n": 20}}
    block = prediction_block(ci, d, load_description())
    return {"sustained": True, "ci95": ci, "prediction_interval": block}


def test_a_confident_plan_needs_the_upper_bound_within_the_slo() -> None:
    from sim.experiments.plan import judge, judge_confident

    table = load_description()
    bound = upper(10.0, 0.1, 20, table.metrics["tpot"], Domain("h100-sxm", 1, 0.2), 0.95)
    assert bound is not None
    inside, outside_ = _summary(10.0 * 0.99 * 10.0 / bound), _summary(10.0 * 1.01 * 10.0 / bound)
    assert judge_confident(inside, None, 10.0, "p99", 0.95, table).passes
    assert not judge_confident(outside_, None, 10.0, "p99", 0.95, table).passes
    assert bound > 10.0  # the shipped TPOT law adds a margin at 95%...
    assert judge(outside_, None, 10.0, "p99").passes  # ...so the point estimate passes here
    other = judge_confident(_summary(1.0, gpu="b200"), None, 10.0, "p99", 0.95, table)
    assert not other.passes and other.hopeless and "b200" in other.why


def test_the_search_finds_the_point_answer_and_goes_on_to_the_confident_one() -> None:
    from sim.experiments.plan import Search

    search = Search({("g", 1): 2, ("h", 1): 2}, max_replicas=10)
    search.record("g", 1, 2, {"shortfall": 1.0}, passed=False, point_passed=True)
    assert search.point[("g", 1)] == 2 and search.open[("g", 1)] == 3
    search.record("g", 1, 3, {}, passed=True, point_passed=True)
    assert search.answer[("g", 1)] == 3 and ("g", 1) not in search.open
    search.record("h", 1, 2, {"shortfall": 1.0, "why": "not validated: GPU h"}, passed=False,
                  point_passed=False, hopeless=True)
    assert ("h", 1) in search.open  # its point answer is still wanted
    search.record("h", 1, 3, {"why": "not validated: GPU h"}, passed=False, point_passed=True,
                  hopeless=True)
    assert ("h", 1) not in search.open and ("h", 1) not in search.answer
    assert search.point[("h", 1)] == 3 and "GPU h" in search.hopeless[("h", 1)]


def test_slo_bounds_tighten_with_the_confidence() -> None:
    from sim.results.stats.prediction import slo_factor, tightened_slo

    table = load_description()
    slo = {"ttft_ms": 1000.0, "tpot_ms": 50.0, "e2el_ms": None}
    loose, tight = tightened_slo(slo, 0.8, table), tightened_slo(slo, 0.99, table)
    assert tight["ttft_ms"] < loose["ttft_ms"] and tight["tpot_ms"] < loose["tpot_ms"]
    assert tight["e2el_ms"] is None
    assert tight["tpot_ms"] == pytest.approx(50.0 / slo_factor(table, "p90_tpot_ms", 0.99))
    assert math.isnan(slo_factor(table, "p99_queue_ms", 0.95))


def test_every_ci95_figure_of_a_run_gets_an_entry_and_the_terminal_prints_the_slo_ones(
        ) -> None:
    from sim.config.loader import validate_scenario
    from sim.config.scenario import DEFAULT_WORKLOAD
    from sim.experiments.run import run_scenario
    from sim.results.files.predicted import refreshed
    from sim.results.files.report import format_summary

    scenario = validate_scenario({"workload": {**DEFAULT_WORKLOAD, "num_requests": 300}},
                                 "prediction")
    summary = run_scenario(scenario, show_progress=False).summary
    block = summary["prediction_interval"]
    assert block["validated"], block["reasons"]
    for key in (k for k in summary["ci95"] if k != "method"):
        assert key in block
    p99 = block["p99_tpot_ms"]
    assert p99["validated_by"] == "tpot" and p99["proxy"] and p99["lo"] < p99["hi"]
    assert block["mean_queue_ms"]["lo"] is None  # no measured counterpart
    assert "Real server, 95% prediction interval" in format_summary(summary)
    wider = {**summary, "ci95": {**summary["ci95"], "p99_tpot_ms": {
        **summary["ci95"]["p99_tpot_ms"], "half_width": 10 * summary["ci95"]["p99_tpot_ms"][
            "half_width"]}}}
    again = refreshed(wider)["prediction_interval"]["p99_tpot_ms"]
    assert again["hi"] - again["lo"] > p99["hi"] - p99["lo"]


def test_plan_and_compare_refuse_a_confidence_outside_0_5_to_1(tmp_path) -> None:  # noqa: ANN001
    import subprocess
    import sys

    for args in (["plan", "scenarios/quickstart.yaml", "--rate", "1", "--confidence", "1"],
                 ["plan", "scenarios/quickstart.yaml", "--rate", "1", "--confidence", "0.2"]):
        out = subprocess.run([sys.executable, "-m", "sim.cli", *args, "--out",
                              str(tmp_path / "x")], capture_output=True, text=True)
        assert out.returncode == 2 and "--confidence" in out.stderr, out.stderr
