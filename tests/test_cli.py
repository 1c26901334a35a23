"""`servesim` end to end: exit codes, the printed table, the files written, determinism."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim import __version__
from sim.cli import COMMANDS, build_parser, main
from sim.experiments.compare_spec import load_spec
from sim.experiments.run import run_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
QUICKSTART = SCENARIOS / "quickstart.yaml"
SERVESIM = Path(sys.executable).parent / "servesim"
HEADINGS = ("Serving Benchmark Result", "Successful requests:", "Time to First Token",
            "Time per Output Token (excl. 1st token)", "Inter-token Latency",
            "End-to-end Latency", "Request goodput (req/s):")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def summary_of(out_dir: Path) -> dict:
    return json.loads((out_dir / "summary.json").read_text())


def test_servesim_run_end_to_end_in_a_subprocess(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    proc = subprocess.run(
        [str(SERVESIM), "run", str(QUICKSTART), "--out", str(out_dir),
         "--set", "workload.num_requests=200"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    for heading in HEADINGS:
        assert heading in proc.stdout
    assert "Traceback" not in proc.stderr
    names = {p.name for p in out_dir.iterdir()}
    assert {"summary.json", "requests.csv", "timeseries.csv"} <= names
    assert {n for n in names if n.endswith(".png")} == {"latency_cdf.png", "timeseries.png"}
    summary = summary_of(out_dir)
    assert summary["completed"] + summary["rejected"] == 200
    assert summary["rejected"] == 0  # quickstart lengths fit the 8192-token context
    assert len(pd.read_csv(out_dir / "requests.csv")) == 200
    series = pd.read_csv(out_dir / "timeseries.csv")
    assert series["steps"].sum() == summary["num_steps"] > 0
    assert series["tokens_emitted"].sum() == summary["total_output_tokens"]
    assert 0.0 <= summary["slo_attainment"] <= 1.0


def test_run_in_process_without_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", str(QUICKSTART), "--out", str(tmp_path),
                             "--set", "workload.num_requests=50", "--no-plots")
    assert code == 0, err
    assert out.startswith("scenario quickstart: llama-3-8b on h100-sxm x1, continuous batching")
    for heading in HEADINGS:
        assert heading in out
    assert not list(tmp_path.glob("*.png"))
    assert summary_of(tmp_path)["completed"] == 50


def test_quiet_prints_nothing_but_writes_results(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", str(QUICKSTART), "--out", str(tmp_path), "--quiet",
                             "--no-plots", "--set", "workload.num_requests=20")
    assert (code, out, err) == (0, "", "")
    assert summary_of(tmp_path)["completed"] == 20


def test_run_without_a_file_uses_the_defaults(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", "--out", str(tmp_path), "--no-plots",
                             "--set", "workload.num_requests=30")
    assert code == 0, err
    assert "scenario quickstart" in out and "Request goodput" not in out  # no SLO by default
    assert summary_of(tmp_path)["completed"] == 30


def run_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                *overrides: str) -> dict:
    out_dir = tmp_path / name
    args = ["run", str(QUICKSTART), "--out", str(out_dir), "--quiet", "--no-plots",
            "--set", "workload.num_requests=150"]
    for override in overrides:
        args += ["--set", override]
    assert run_cli(capsys, *args)[0] == 0
    summary = summary_of(out_dir)
    assert summary.pop("simulation_wall_s") > 0
    return summary


def test_same_seed_same_summary_other_seed_different(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    first = run_summary(tmp_path, capsys, "a")
    again = run_summary(tmp_path, capsys, "b")
    other = run_summary(tmp_path, capsys, "c", "seed=1")
    assert first == again
    assert (tmp_path / "a" / "requests.csv").read_text() == (
        tmp_path / "b" / "requests.csv").read_text()
    assert other != first
    assert other["total_input_tokens"] != first["total_input_tokens"]


ERROR_CASES = {
    "unknown key": ("modle: llama-3-8b\n", (), "modle: unknown key; allowed:"),
    "nested unknown key": ("scheduler: {max_num_seq: 3}\n", (), "scheduler.max_num_seq"),
    "wrong type": ("scheduler: {max_num_seqs: many}\n", (), "(got 'many')"),
    "negative rate": ("", ("workload.arrivals.rate=-1",), "workload.arrivals.rate"),
    "unknown model": ("model: llama-9b\n", (), "unknown model 'llama-9b'; known:"),
    "unknown gpu": ("hardware: {gpu: h900}\n", (), "unknown hardware 'h900'; known:"),
    "invalid yaml": ("name: [x\n", (), "not valid YAML"),
    "not a mapping": ("- 1\n", (), "must be a mapping"),
    "malformed set": ("", ("seed",), "expected key.path=value"),
    "bad tp": ("hardware: {count: 3}\n", (), "hardware.count: tp=3"),
    "missing trace": ("workload: {trace: {path: nope.csv}}\n", (),
                      "trace file 'nope.csv' not found"),
    "no room for kv": ("model: llama-3-70b\n", (), "no memory left for KV cache"),
}


@pytest.mark.parametrize("text, overrides, expected", ERROR_CASES.values(), ids=ERROR_CASES)
def test_scenario_errors_exit_2_with_one_short_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
        overrides: tuple[str, ...], expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text or "name: bad\n")
    args = ["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]
    for override in overrides:
        args += ["--set", override]
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err
    assert str(path) in err or "--set" in err  # says which input is wrong
    assert "Traceback" not in err and len(err) < 400
    assert not (tmp_path / "out").exists()


def test_missing_scenario_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", str(tmp_path / "nope.yaml"))
    assert code == 2 and err == f"error: {tmp_path / 'nope.yaml'}: no such scenario file\n"


def test_scenario_error_in_a_subprocess_has_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("scheduler: {max_num_seqs: many}\n")
    proc = subprocess.run([str(SERVESIM), "run", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}: scheduler.max_num_seqs: Input should be a valid integer, "
        "unable to parse string as an integer (got 'many')"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"servesim {__version__}"


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--bogus"])
    assert info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_a_command_line_builds_its_command_alone_with_the_same_help() -> None:
    """main() builds only the parser of the command it is given (sim.cli.COMMANDS); each
    command's help is then what the full parser gives, and the table names every command."""
    whole = build_parser()
    full = subcommands(whole)
    assert set(full) == set(COMMANDS)
    for name, parser in full.items():
        alone = build_parser(name)
        assert alone.format_usage() == whole.format_usage()  # what a usage error prints
        built = [n for n, p in subcommands(alone).items() if p._actions[1:]]
        assert name in built and len(built) <= 2  # explain's module adds explain and plot
        assert subcommands(alone)[name].format_help() == parser.format_help()
    assert build_parser("no-such-command").format_help() == whole.format_help()


def test_an_unknown_command_is_named_among_all(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["rnu"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'rnu'" in err and "'run'" in err and "'calibrate'" in err


def test_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "capacity", "--model", "llama-3-8b")
    assert code == 0, err
    assert "llama-3-8b" in out and "h100-sxm" in out


def is_compare_spec(path: Path) -> bool:
    return "variants" in (yaml.safe_load(path.read_text()) or {})


SCENARIO_FILES = [p for p in sorted(SCENARIOS.glob("*.yaml")) if not is_compare_spec(p)]
COMPARE_SPECS = [p for p in sorted(SCENARIOS.glob("*.yaml")) if is_compare_spec(p)]


@pytest.mark.parametrize("path", COMPARE_SPECS, ids=lambda p: p.name)
def test_every_shipped_compare_spec_runs_each_variant(path: Path) -> None:
    """Each variant of a shipped compare spec validates and runs (on a few requests)."""
    base = load_spec(path)
    policies = set()
    for variant in base.spec.variants:
        scenario = base.scenario(variant, 4.0)
        small = scenario.model_copy(
            update={"workload": scenario.workload.model_copy(update={"num_requests": 40})})
        summary = run_scenario(small, base.base_dir, show_progress=False).summary
        assert summary["completed"] + summary["rejected"] == 40
        # what a variant may change: anything but the request stream (policy, KV, router...)
        policies.add(json.dumps(scenario.model_dump(exclude={"workload"}), sort_keys=True))
    assert len(policies) == len(base.spec.variants), "variants must differ"


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_every_shipped_scenario_runs(path: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", str(path), "--out", str(tmp_path), "--no-plots",
                             "--set", "workload.num_requests=100")
    assert code == 0, err
    assert f"scenario {path.stem}:" in out
    summary = summary_of(tmp_path)
    assert summary["completed"] + summary["rejected"] == 100
    assert summary["completed"] > 90


def test_synthetic_trace_replays_the_shipped_trace(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", str(SCENARIOS / "synthetic_trace.yaml"),
                           "--out", str(tmp_path), "--no-plots", "--quiet",
                           "--set", "workload.num_requests=100")
    assert code == 0, err
    requests = pd.read_csv(tmp_path / "requests.csv").sort_values("request_id")
    shipped = pd.read_csv(ROOT / "sim" / "workload" / "data" / "synthetic_conv.csv").head(100)
    assert list(requests["prompt_tokens"]) == list(shipped["prompt_tokens"])
    assert list(requests["output_tokens"]) == list(shipped["output_tokens"])
    assert requests["arrival_s"].to_numpy() == pytest.approx(shipped["arrival_s"].to_numpy())
