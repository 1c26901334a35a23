"""Validation: the CPU engine against the simulator, and the fidelity report of the two.

Wall-clock agreement is reported (benchmarks/fidelity_cpu.py), never asserted: what gates
is what holds on any machine (the simulator fed the engine's step times reproduces it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")  # the engine's side; a simulator-only install skips this file

from calibrate.bracket import bracket_problems, replay_passes  # noqa: E402
from calibrate.fit import fit_table  # noqa: E402
from calibrate.gpu import check as gpu_check
from calibrate.gpu import plan as gpu_plan
from calibrate.gpu import report as gpu_report  # noqa: E402
from calibrate.profile.run import ProfileSettings, profile_engine  # noqa: E402
from calibrate.report import (  # noqa: E402
    markdown,
    requests_frame,
    step_errors,
    ttft_components,
    write_report,
)
from calibrate.validate import (  # noqa: E402
    METRICS,
    acceptance_config,
    compare,
    engine_acceptance,
    relative_error_pct,
    run_engine,
    steps_table,
)
from sim.cli import main  # noqa: E402
from sim.config.loader import load_scenario  # noqa: E402
from sim.config.speculative import BetaAlphaConfig, FixedAlphaConfig  # noqa: E402
from sim.core.plan import StepShape  # noqa: E402
from sim.experiments.run import run_scenario  # noqa: E402
from sim.latency.table_files import open_table_latency, read_measurements  # noqa: E402
from sim.results.stats.sketch import DEFAULT_RELATIVE_ERROR  # noqa: E402
from sim.world.speculation import expected_tokens_per_step  # noqa: E402

SCENARIO = """
name: ci_calibrate
seed: 3
model: tiny
hardware:
  gpu: {name: cpu-host, bf16_flops_per_s: 5.0e10, memory_bytes: 268435456,
        memory_bandwidth_bytes_per_s: 1.0e10, interconnect_bandwidth_bytes_per_s: 1.0e10,
        host_link_bandwidth_bytes_per_s: 1.0e10}
  memory_utilization: 0.5
scheduler: {policy: continuous, max_num_seqs: 8, max_num_batched_tokens: 256,
            max_model_len: 512}
kv: {block_size: 16}
engine: {device: cpu, dtype: float32}
workload:
  arrivals: {process: poisson, rate: 6.0}
  prompt_tokens: {dist: lognormal, mean: 64, cv: 0.5, min: 4, max: 240}
  output_tokens: {dist: lognormal, mean: 16, cv: 0.5, min: 2, max: 48}
  num_requests: 30
"""


PROFILE = ProfileSettings(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=512,
                          budget_s=8.0, repeats=5, passes=2)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """Profile the tiny CPU engine in 2 passes with a 30-request replay between them; fit;
    compare the replay with the simulator on its requests; write the report.

    Nothing here asserts how close the wall-clock numbers come: on a shared machine that
    is noise (benchmarks/fidelity_cpu.py reports it). What is asserted is what must hold
    on any machine: the report's contents, and that the simulator fed the engine's own
    step times reproduces it exactly.
    """
    root = tmp_path_factory.mktemp("calibrate")
    scenario_path = root / "ci.yaml"
    scenario_path.write_text(SCENARIO)
    replays = []

    def replay(_finished_pass: int) -> None:
        scenario, base_dir = load_scenario(scenario_path)
        replays.append((scenario, base_dir, run_engine(scenario, base_dir, threads=1,
                                                       show_progress=False)))

    table = root / "cpu-tiny"
    profile_engine(PROFILE, table, show_progress=False, between_passes=replay)
    fit_table(table)
    fidelities = [compare(scenario, base_dir, table, run) for scenario, base_dir, run in replays]
    written = write_report(fidelities[0], root / "fidelity")
    return root, table, scenario_path, fidelities, written, replays


def test_the_report_rests_on_a_world_that_reproduces_the_engine(calibrated) -> None:  # noqa: ANN001
    """The gating half of engine vs simulator: fed the engine's measured step times, the
    simulator puts all 30 requests on the engine's timestamps, so the table's request-level
    errors are its step errors; how big those are on this machine is reported, not tested."""
    root, _, _, fidelities, _, replays = calibrated
    fidelity = fidelities[0]
    assert fidelity.engine.summary["completed"] == fidelity.table.summary["completed"] == 30
    assert fidelity.info["world_check"] == "exact"
    assert "reproduces every request's timestamps exactly" in (root / "fidelity" /
                                                               "fidelity.md").read_text()
    # the engine's TTFT is its steps: arrivals at an idle engine start a step right then
    engine = fidelity.engine.recorder.requests_frame()
    parts = ttft_components(engine)
    assert parts["idle_requests"] + parts["queued_requests"] == 30
    idle = engine[engine["first_scheduled_s"] == engine["arrival_s"]]
    starts = {log.start_s: log for log in replays[0][2].steps}
    for row in idle.itertuples():
        log = starts[row.arrival_s]
        assert row.first_token_s == log.start_s + log.duration_s


def test_ttft_components_split_idle_arrivals_from_queued_ones() -> None:
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0, 1.001, 2.0],
                          "first_scheduled_s": [0.0, 1.0, 1.003, np.nan],
                          "first_token_s": [0.002, 1.002, 1.006, np.nan]})
    parts = ttft_components(frame)
    assert parts["idle_requests"] == 2 and parts["queued_requests"] == 1
    assert parts["idle_ttft_ms"] == pytest.approx(2.0)
    assert parts["queued_wait_ms"] == pytest.approx(2.0)
    assert parts["queued_prefill_ms"] == pytest.approx(3.0)
    assert parts["ttft_ms"] == pytest.approx(2.0)


def test_speculative_replay_is_compared_with_the_engines_acceptance(calibrated  # noqa: ANN001
                                                                    ) -> None:
    """The profile measured verify shapes (k drafts per decode); validating a speculative
    (n-gram) scenario hands the simulator the engine's acceptance, so both emit alike per
    verify and the comparison is of timing."""
    _, table, scenario_path, _, _, _ = calibrated
    verify_rows = [m for m in read_measurements(table) if m.kind == "verify"]
    assert verify_rows and all(m.decode_query_tokens > 1 for m in verify_rows)
    scenario, base_dir = load_scenario(scenario_path, ["speculative.num_tokens=3"])
    fidelity = compare(scenario, base_dir, table,
                       run_engine(scenario, base_dir, threads=1, show_progress=False))
    engine, sim = fidelity.engine.summary, fidelity.table.summary
    assert engine["spec_draft_tokens"] > 0 and sim["spec_draft_tokens"] > 0
    spec = fidelity.info["speculation"]
    assert spec["tokens_per_verify"] == pytest.approx(engine["mean_tokens_per_spec_step"])
    assert sim["mean_tokens_per_spec_step"] == pytest.approx(
        engine["mean_tokens_per_spec_step"], rel=0.1)
    assert fidelity.info["world_check"] == "exact"  # the engine's own acceptances, replayed
    verify = fidelity.steps[fidelity.steps["kind"] == "verify"]
    assert len(verify) and (verify["table_ms"] > 0).all()
    assert "verify" in set(step_errors(fidelity.steps)["kind"])
    assert "Speculative decoding: the engine accepted" in markdown(fidelity, plots=False)


def test_report_carries_the_actual_numbers(calibrated) -> None:  # noqa: ANN001
    root, _, _, fidelities, written, _ = calibrated
    fidelity = fidelities[0]
    out = root / "fidelity"
    names = {p.name for p in written}
    assert {"fidelity.json", "fidelity.md", "steps.csv", "requests.csv", "latency_cdf.png",
            "step_latency.png"} <= names
    data = json.loads((out / "fidelity.json").read_text())
    assert [m["key"] for m in data["metrics"]] == [k for k, _, _ in METRICS]
    for row, m in zip(data["metrics"], fidelity.metrics, strict=True):
        assert row["engine"] == pytest.approx(m.engine)
        assert row["table"] == pytest.approx(m.table)
        assert row["table_error_pct"] == pytest.approx(m.table_error_pct)
        assert row["roofline"] == pytest.approx(m.roofline)
    assert data["table_metadata"]["device_kind"] == "cpu"
    text = (out / "fidelity.md").read_text()
    for m in fidelity.metrics:
        assert f"| {m.label} ({m.unit}) |" in text
        assert f"{m.table_error_pct:+.1f}%" in text
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == fidelity.info["engine_steps"] == len(fidelity.steps)
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 30 and requests["ttft_ms_engine"].notna().all()
    # the table's TTFT p50 in the JSON is the median of the requests the CSV lists, within
    # the summary's sketch error (sim.results.stats.sketch) plus the CSV's 6 significant digits
    assert requests["ttft_ms_table"].median() == pytest.approx(
        fidelity.metric("median_ttft_ms").table, rel=DEFAULT_RELATIVE_ERROR + 5e-6)


def test_each_engine_step_is_priced_by_both_models(calibrated) -> None:  # noqa: ANN001
    table, fidelities = calibrated[1], calibrated[3]
    fidelity = fidelities[0]
    model = open_table_latency(table)
    steps = fidelity.steps
    assert set(steps["kind"]) <= {"prefill", "decode", "mixed"}
    assert (steps["measured_ms"] > 0).all() and (steps["roofline_ms"] > 0).all()
    for row in steps[steps["kind"] == "decode"].head(20).itertuples():
        shape = StepShape(num_decodes=row.num_decodes, decode_context_sum=row.decode_context_sum,
                          decode_context_max=row.decode_context_max, padded_batch=row.num_seqs)
        assert row.table_ms == pytest.approx(model.step_time(shape) * 1e3)
    # back to back, the steps tile the engine's busy time: no overlaps, gaps only when idle
    ends = steps["start_s"] + steps["measured_ms"] / 1e3
    assert (steps["start_s"].iloc[1:].to_numpy() >= ends.iloc[:-1].to_numpy() - 1e-9).all()


def test_validate_refuses_a_table_of_another_setup(calibrated, tmp_path: Path,  # noqa: ANN001
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    table, scenario = calibrated[1], calibrated[2]
    code = main(["calibrate", "validate", str(scenario), "--table", str(table), "--set",
                 "kv.block_size=32", "--out", str(tmp_path / "x"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--table:" in err and "block_size: table 16, scenario 32" in err
    assert main(["calibrate", "validate", str(scenario), "--table",
                 str(tmp_path / "missing"), "--quiet"]) == 2
    assert "no such calibration table directory" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_bracketing_refuses_what_it_cannot_compare(calibrated, tmp_path: Path,  # noqa: ANN001
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    scenario_path = calibrated[2]
    scenario, _ = load_scenario(scenario_path)
    ok = ProfileSettings(passes=2)
    assert bracket_problems(ok, scenario) == []
    assert "passes: bracketing 1 replay(s) needs at least 2 passes, got 1" in bracket_problems(
        dataclasses.replace(ok, passes=1), scenario)
    assert "passes: bracketing 2 replay(s) needs at least 3 passes, got 2" in bracket_problems(
        ok, scenario, replays=2)
    assert any(p.startswith("model:") for p in bracket_problems(
        dataclasses.replace(ok, model="llama-100m"), scenario))
    assert any(p.startswith("block_size:") for p in bracket_problems(
        dataclasses.replace(ok, block_size=32), scenario))
    assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out",
                 str(tmp_path / "t"), "--passes", "1", "--validate", str(scenario_path)]) == 2
    assert "--passes: bracketing 1 replay(s) needs at least 2" in capsys.readouterr().err
    assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out",
                 str(tmp_path / "t"), "--passes", "3", "--validate", str(scenario_path),
                 "--validate", str(scenario_path), "--fidelity-out", str(tmp_path / "f")]) == 2
    assert "--fidelity-out: one directory for 2 scenarios" in capsys.readouterr().err
    assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out",
                 str(tmp_path / "t"), "--validate", str(tmp_path / "none.yaml")]) == 2
    assert "--validate:" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_replays_sit_between_consecutive_passes_around_the_middle() -> None:
    assert replay_passes(4, 1) == [2] and replay_passes(2, 1) == [1]
    assert replay_passes(4, 2) == [2, 3] and replay_passes(4, 3) == [1, 2, 3]
    assert replay_passes(7, 2) == [3, 4]


def test_profile_cli_validates_several_scenarios_each_between_two_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(SCENARIO.replace("num_requests: 30", "num_requests: 8"))
    speculative = tmp_path / "spec.yaml"
    speculative.write_text(plain.read_text().replace("name: ci_calibrate", "name: ci_spec")
                           + "speculative: {num_tokens: 2}\n")
    out = tmp_path / "t"
    assert main(["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out",
                 str(out), "--budget-s", "2", "--passes", "3", "--repeats", "2",
                 "--max-num-batched-tokens", "256", "--max-num-seqs", "8",
                 "--max-model-len", "512", "--quiet", "--validate", str(plain),
                 "--validate", str(speculative)]) == 0
    first = json.loads((out / "fidelity" / "fidelity.json").read_text())
    second = json.loads((out / "fidelity-ci_spec" / "fidelity.json").read_text())
    assert first["scenario"] == "ci_calibrate" and second["scenario"] == "ci_spec"
    assert first["info"]["bracketed"].startswith("between passes 1 and 2")
    assert second["info"]["bracketed"].startswith("between passes 2 and 3")
    assert "speculation" in second["info"] and "speculation" not in first["info"]
    assert first["table"] == ".."  # the report names its table relative to itself
    assert "ci_spec:" in capsys.readouterr().out


def test_relative_error_is_signed_against_the_engine() -> None:
    assert relative_error_pct(110.0, 100.0) == pytest.approx(10.0)
    assert relative_error_pct(90.0, 100.0) == pytest.approx(-10.0)
    assert math.isnan(relative_error_pct(1.0, 0.0))
    assert math.isnan(relative_error_pct(math.nan, 1.0))


def test_step_errors_sum_busy_time_per_kind() -> None:
    steps = pd.DataFrame({"kind": ["decode", "decode", "prefill"],
                          "measured_ms": [2.0, 2.0, 10.0], "table_ms": [1.0, 3.0, 12.0],
                          "roofline_ms": [1.0, 1.0, 1.0]})
    rows = step_errors(steps).set_index("kind")
    assert rows.loc["decode", "table_busy_error_pct"] == pytest.approx(0.0)
    assert rows.loc["decode", "table_median_ape_pct"] == pytest.approx(50.0)
    assert rows.loc["prefill", "table_busy_error_pct"] == pytest.approx(20.0)
    assert rows.loc["all", "roofline_busy_error_pct"] == pytest.approx((3 / 14 - 1) * 100)
    assert rows.loc["all", "steps"] == 3


def test_markdown_and_requests_frame_of_a_real_run(calibrated) -> None:  # noqa: ANN001
    fidelity = calibrated[3][0]
    text = markdown(fidelity, plots=False)
    assert "latency_cdf.png" not in text and "Largest table error" in text
    frame = requests_frame(fidelity)
    assert list(frame["request_id"]) == sorted(frame["request_id"])
    assert {"ttft_ms_engine", "tpot_ms_table", "e2el_ms_roofline"} <= set(frame.columns)


def test_steps_table_prices_shapes_with_the_given_models() -> None:
    from gpu_engine.engine import StepLog

    class Fixed:
        name = "fixed"

        def __init__(self, seconds: float) -> None:
            self.seconds = seconds

        def step_time(self, shape: StepShape) -> float:
            return self.seconds * (1 + shape.num_decodes)

    logs = [StepLog(0.0, 0.004, 0.004, 0.003, StepShape(num_decodes=3,
                                                          decode_context_sum=30), 3, 48),
            StepLog(0.004, 0.01, 0.01, 0.009, StepShape((16,), (0,)), 1, 16)]
    frame = steps_table(logs, Fixed(0.001), Fixed(0.002))  # type: ignore[arg-type]
    assert list(frame["kind"]) == ["decode", "prefill"]
    assert list(frame["table_ms"]) == pytest.approx([4.0, 1.0])
    assert list(frame["roofline_ms"]) == pytest.approx([8.0, 2.0])
    assert list(frame["measured_ms"]) == pytest.approx([4.0, 10.0])


# -- the GPU script, on its CPU path ----------------------------------------------------
class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.t_s = 0.0

    def __call__(self) -> float:
        return self.t_s


def test_gpu_script_smoke_runs_the_whole_path_and_the_report_after_it(tmp_path: Path) -> None:
    """The GPU half (correctness, speed, profile, fit, recorded replay), then the simulator's
    half from its files: the world check is exact and every metric is reported."""
    out, report = tmp_path / "out", tmp_path / "report"
    assert gpu_check.main([str(out), "--smoke"], clock=FakeClock()) == 0
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "summary.md",
                                                     "tiny.tar.gz"]
    data = json.loads((out / "results.json").read_text())
    correct = data["correctness"]
    assert correct["attention_ok"] and correct["host_syncs_per_step"]["ok"]
    assert {r["kind"] for r in data["speed"]["rows"]} == {"decode", "prefill"}
    model = data["models"]["tiny"]
    assert model["profile"]["points"] >= 10 and model["replay"]["requests"] == 4
    assert "stopped" not in (out / "summary.md").read_text()
    assert gpu_report.main([str(out), str(report)]) == 0
    summary = (report / "summary.md").read_text()
    assert "| TTFT p50 (ms) |" in summary and "## tiny" in summary
    fidelity = json.loads((report / "results.json").read_text())["models"]["tiny"]["validate"]
    assert fidelity["metrics"] and fidelity["info"]["world_check"] == "exact"
    assert (report / "tiny" / "table" / "fit.json").is_file()
    assert (report / "tiny" / "fidelity" / "fidelity.md").is_file()


def test_gpu_script_time_guard_stops_at_the_next_phase_and_still_writes_a_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline passes during the fit (on a fake clock): the guard stops before the
    replay, keeps what was done and exits with 3, whenever a signal would have landed."""
    clock = FakeClock()
    fit = gpu_check.fit_table

    def slow_fit(table: Path):  # noqa: ANN202
        done = fit(table)
        clock.t_s += 10_000.0
        return done

    monkeypatch.setattr(gpu_check, "fit_table", slow_fit)
    assert gpu_check.main([str(tmp_path), "--smoke"], clock=clock) == 3
    summary = (tmp_path / "summary.md").read_text()
    assert "stopped by the 240 s time guard before tiny replay" in summary
    data = json.loads((tmp_path / "results.json").read_text())
    assert {"profile", "fit"} <= set(data["models"]["tiny"]) and \
        "replay" not in data["models"]["tiny"]
    with tarfile.open(tmp_path / "tiny.tar.gz") as tar:  # the table made it out
        names = tar.getnames()
    assert "tiny/table/fit.json" in names and "tiny/record.json" not in names


def test_gpu_script_skips_a_replay_that_cannot_finish_in_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    fit = gpu_check.fit_table

    def fit_then_little_left(table: Path):  # noqa: ANN202
        done = fit(table)
        clock.t_s = 239.0  # 1 s of the smoke's 240 left
        return done

    monkeypatch.setattr(gpu_check, "fit_table", fit_then_little_left)
    assert gpu_check.main([str(tmp_path), "--smoke"], clock=clock) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["models"]["tiny"]["replay"].startswith("skipped: needs about")


def test_gpu_script_imports_neither_simpy_nor_pydantic() -> None:
    """The GPU image has neither: the script and everything it runs must do without."""
    import subprocess
    import sys

    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in ('simpy', 'pydantic', 'pydantic_core'):\n"
            "            raise ImportError('blocked ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import calibrate.gpu.check\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_committed_replay_plans_are_what_their_scenarios_give() -> None:
    assert gpu_plan.main(["--check"]) == 0


def test_deadline_is_checked_on_its_clock() -> None:
    clock = FakeClock()
    guard = gpu_check.Deadline(5.0, clock)
    clock.t_s = 4.0
    guard.check()
    assert guard.left_s() == pytest.approx(1.0) and not guard.fired
    clock.t_s = 5.0
    with pytest.raises(gpu_check.TimeUp):
        guard.check()
    assert guard.fired


def test_gpu_script_alarm_is_remembered_and_fires_again_when_swallowed() -> None:
    """An exception raised in a gc callback or finalizer is printed and dropped by Python:
    the alarm re-arms itself, and remembers that it fired for when the work ends anyway."""
    import signal

    alarm = gpu_check.Alarm()
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        assert not alarm.fired
        with pytest.raises(gpu_check.TimeUp):
            alarm(signal.SIGALRM, None)
        assert alarm.fired
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_gpu_script_refuses_cuda_without_a_gpu(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the full run would start")
    assert gpu_check.main([str(tmp_path)], clock=FakeClock()) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_engine_acceptance_reads_the_engines_summary() -> None:
    assert engine_acceptance({}) == {}  # no speculation: nothing to hand the simulator
    none = engine_acceptance({"spec_draft_tokens": 30, "spec_accepted_tokens": 0,
                              "mean_tokens_per_spec_step": 1.0})
    assert none["alpha"] == 0.0 and none["acceptance_rate"] == 0.0
    # 10 verifies of 3 drafts each, 12 drafts accepted: 2.2 tokens per verify
    some = engine_acceptance({"spec_draft_tokens": 30, "spec_accepted_tokens": 12,
                              "mean_tokens_per_spec_step": 2.2})
    assert some["drafts_per_verify"] == pytest.approx(3.0)
    assert some["acceptance_rate"] == pytest.approx(0.4)
    assert expected_tokens_per_step(some["alpha"], 3) == pytest.approx(2.2)
    assert acceptance_config(some) == FixedAlphaConfig(alpha=some["alpha"])
    # per request: one never matched (5 verifies, nothing accepted), one nearly always did
    frame = pd.DataFrame({"spec_drafted": [15, 15, 0], "spec_accepted": [0, 12, 0]})
    spread = engine_acceptance({"spec_draft_tokens": 30, "spec_accepted_tokens": 12,
                                "mean_tokens_per_spec_step": 2.2}, frame)
    assert spread["alpha"] == pytest.approx(some["alpha"]) and spread["alpha_std"] > 0.3
    beta = acceptance_config(spread)
    assert isinstance(beta, BetaAlphaConfig) and beta.mean == pytest.approx(some["alpha"])
    assert beta.std < math.sqrt(beta.mean * (1 - beta.mean))  # kept a feasible Beta


def test_the_simulator_pads_where_the_engine_ran(calibrated, tmp_path: Path) -> None:  # noqa: ANN001
    """`engine.device: auto` with `cuda_graphs` null pads decode steps on a GPU only: a replay
    that ran on the CPU is simulated unpadded, as the engine ran it."""
    _, table, scenario_path, _, _, _ = calibrated
    path = tmp_path / "busy.yaml"  # busy enough for decode batches of 3, 5, 6 or 7
    path.write_text(scenario_path.read_text().replace("rate: 6.0", "rate: 200.0")
                    .replace("engine: {device: cpu,", "engine: {device: auto,"))
    auto, base_dir = load_scenario(path)
    assert auto.engine.uses_cuda_graphs()  # simulated on its own, auto means a GPU
    assert run_scenario(auto, base_dir, show_progress=False).summary["slot_utilization"] < 1
    replay = run_engine(auto, base_dir, threads=1, show_progress=False)
    fidelity = compare(auto, base_dir, table, replay)
    # no simulated step was padded (a padded slot is an idle one), as on the engine
    assert fidelity.table.summary["slot_utilization"] == 1.0
    assert fidelity.roofline.summary["slot_utilization"] == 1.0
    assert fidelity.info["world_check"] == "exact"
