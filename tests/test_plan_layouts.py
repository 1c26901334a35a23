"""`servesim plan` over DP x TP x EP layouts of an MoE model (sim.experiments.plan_layouts)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.config.catalogue import get_hardware, get_model
from sim.config.loader import read_scenario_raw
from sim.config.sections import resolve_model
from sim.experiments.plan_layouts import dp_layouts, layout_label, parse_dps
from sim.experiments.plan_run import PlanQuestion

MOE_SCENARIO = """\
name: moeplan
seed: 1
model: {config: builtin:qwen3-30b-a3b}
workload:
  arrivals: {process: poisson, rate: 1.0}
  prompt_tokens: {dist: lognormal, mean: 400, cv: 1.0, min: 4, max: 2000}
  output_tokens: {dist: lognormal, mean: 80, cv: 1.0, min: 1, max: 400}
  num_requests: 200
slo: {ttft_ms: 1000, tpot_ms: 50}
"""


def test_auto_degrees_divide_the_tp_gpu_counts_and_only_for_moe() -> None:
    moe, dense = resolve_model({"config": "builtin:qwen3-30b-a3b"}), get_model("llama-3-8b")
    assert parse_dps("auto", moe, (1, 2, 4, 8)) == (2, 4, 8)
    assert parse_dps("auto", moe, (8,)) == (2, 4, 8)
    assert parse_dps("auto", moe, (6,)) == (2, 3, 6)
    assert parse_dps("auto", dense, (1, 2, 4, 8)) == ()
    assert parse_dps("1", moe, (8,)) == ()
    assert parse_dps("8,2,8", moe, (8,)) == (2, 8)
    with pytest.raises(ValueError, match="--dp.*dense"):
        parse_dps("2", dense, (2,))
    with pytest.raises(ValueError, match="--dp"):
        parse_dps("two", moe, (2,))
    with pytest.raises(ValueError, match="--dp"):
        parse_dps("0", moe, (2,))


def test_layouts_use_the_tp_gpu_counts_and_prune_what_cannot_split() -> None:
    model = resolve_model({"config": "builtin:qwen3-30b-a3b"})  # 128 experts, 4 KV heads
    gpus = {"h100-sxm": get_hardware("h100-sxm")}
    found = dp_layouts(model, gpus, (2, 3, 8), (2, 3, 4, 8), longest_tokens=4000)
    assert {(d.dp, d.tp) for d in found} == {(2, 1), (2, 4), (3, 1), (4, 2), (8, 1)}
    assert all(d.gpus in (2, 3, 8) for d in found)
    three = next(d for d in found if d.dp == 3)
    assert not three.fits and three.reason  # 128 experts do not split over 3 GPUs
    assert all(d.fits for d in found if d.dp != 3)
    # a rank must hold one longest request beside its weights
    huge = dp_layouts(resolve_model({"config": "builtin:deepseek-v3"}), gpus, (2,), (2,),
                      longest_tokens=4000)
    assert len(huge) == 1 and not huge[0].fits and "room" in huge[0].reason
    assert layout_label(1, 8) == "DP8 x TP1 + EP8" and layout_label(8, 1, 2) == "TP8 x2"


def test_a_dp_layout_is_one_group_with_the_experts_over_all_its_gpus(tmp_path: Path) -> None:
    path = tmp_path / "moeplan.yaml"
    path.write_text(MOE_SCENARIO)
    q = PlanQuestion(read_scenario_raw(path), str(path), tmp_path, 4.0, ("h100-sxm",), (2,),
                     dps=(2,), dp_batched_tokens=1024)
    dp = q.scenario("h100-sxm", 1, 1, dp=2)
    hw = dp.hardware
    assert (hw.count, hw.data_parallel, hw.expert_parallel, hw.tensor_parallel) == (2, 2, 2, 1)
    assert dp.replicas == 1 and dp.scheduler.max_num_batched_tokens == 1024
    tp = q.scenario("h100-sxm", 2, 3)
    assert (tp.hardware.count, tp.hardware.data_parallel, tp.replicas) == (2, 1, 3)
    assert tp.scheduler.max_num_batched_tokens != 1024  # the budget is the DP ranks' only
    # a DP base planned as pure TP drops its data parallelism
    raw = read_scenario_raw(path)
    raw["hardware"] = {"count": 2, "expert_parallel": 2, "data_parallel": 2}
    q2 = PlanQuestion(raw, str(path), tmp_path, 4.0, ("h100-sxm",), (4,))
    four = q2.scenario("h100-sxm", 4, 1)
    assert (four.hardware.count, four.hardware.data_parallel,
            four.hardware.expert_parallel) == (4, 1, 1)


def test_plan_weighs_dp_layouts_beside_tp(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "moeplan.yaml"
    scenario.write_text(MOE_SCENARIO)
    out = tmp_path / "out"
    code = main(["plan", str(scenario), "--rate", "8", "--gpu", "h100-sxm", "--tp", "2",
                 "--requests", "300", "--jobs", "1", "--out", str(out), "--no-plots"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    tried = pd.read_csv(out / "tried.csv")
    dp_rows = tried[tried.dp > 1]
    assert len(dp_rows) == 1  # one group, simulated once: no replica search
    row = dp_rows.iloc[0]
    assert (row.dp, row.tp, row.replicas, row.gpus) == (2, 1, 1, 2)
    table = pd.read_csv(out / "plan.csv")
    assert table["cost"].is_monotonic_increasing and table["passes"].all()
    passing = tried[tried.passes]
    assert table.iloc[0]["cost"] == passing["cost"].min()  # the cheapest of both kinds
    if row.passes:
        assert "DP2 x TP1 + EP2" in stdout
    else:
        assert "DP groups are not modelled" in stdout


def test_dp_on_a_dense_model_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    scenario = tmp_path / "dense.yaml"
    scenario.write_text(MOE_SCENARIO.replace("{config: builtin:qwen3-30b-a3b}", "llama-3-8b"))
    out = tmp_path / "out"
    assert main(["plan", str(scenario), "--rate", "5", "--dp", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--dp" in err and "Traceback" not in err and not out.exists()
    assert main(["plan", str(scenario), "--rate", "5", "--dp-batched-tokens", "0",
                 "--out", str(out)]) == 2
    assert "--dp-batched-tokens" in capsys.readouterr().err
