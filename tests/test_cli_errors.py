"""Every user mistake: exit code 2, one short message, no traceback, caught before the work.

Also what a run leaves behind: one run per directory, with its provenance.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import sim.cli
import sim.cli.engine
import sim.experiments.run
from sim import __version__
from sim.cli import main
from sim.config.scenario import SCHEMA_VERSION

SMALL = """
workload:
  arrivals: {process: poisson, rate: 4}
  prompt_tokens: {dist: fixed, value: 100}
  output_tokens: {dist: fixed, value: 10}
  num_requests: 20
"""
SPEC = """
scenario:
  workload:
    arrivals: {process: poisson, rate: 1}
    prompt_tokens: {dist: fixed, value: 100}
    output_tokens: {dist: fixed, value: 10}
    num_requests: 20
variants:
  - {name: a, set: {scheduler.max_num_seqs: 8}}
  - {name: b, set: {scheduler.max_num_seqs: 16}}
rates: [2]
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code: int, out: str, err: str, *expected: str) -> None:
    assert code == 2, err
    assert out == ""
    assert err.startswith("error: ") and "Traceback" not in err and len(err) < 600, err
    for text in expected:
        assert text in err, err


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a simulation starts: mistakes must be caught before the work."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started before the mistake was caught")

    import sim.experiments.compare
    import sim.experiments.run
    import sim.experiments.runner
    import sim.experiments.sweep

    monkeypatch.setattr(sim.experiments.run, "run_scenario", forbidden)
    monkeypatch.setattr(sim.experiments.sweep, "run_task", forbidden)
    monkeypatch.setattr(sim.experiments.runner, "run_task", forbidden)
    monkeypatch.setattr(sim.experiments.compare, "run_compare", forbidden)


# -- output directories, before the work ---------------------------------------------

@pytest.mark.parametrize("command", ["run", "compare", "sweep"])
def test_an_output_dir_that_is_a_file_fails_before_the_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None, command: str) -> None:
    blocker = write(tmp_path, "", "blocker")
    args = {"run": ["run", str(write(tmp_path, SMALL))],
            "compare": ["compare", str(write(tmp_path, SPEC, "c.yaml"))],
            "sweep": ["sweep", str(write(tmp_path, SMALL)), "--grid", "seed=1,2"]}[command]
    for out in (blocker, blocker / "inside"):
        code, stdout, err = cli(capsys, *args, "--out", str(out))
        assert_user_error(code, stdout, err, "--out", str(blocker), "is a file")


def test_an_output_dir_name_too_long_fails_before_the_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None) -> None:
    code, out, err = cli(capsys, "run", str(write(tmp_path, SMALL)),
                         "--out", str(tmp_path / ("r" * 300)))
    assert_user_error(code, out, err, "300 bytes long")


def test_output_dir_from_the_scenario_is_named_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None) -> None:
    write(tmp_path, "", "blocker")
    path = write(tmp_path, f"output: {{dir: {tmp_path / 'blocker'}}}\n" + SMALL)
    assert_user_error(*cli(capsys, "run", str(path)), "output.dir", "is a file")


def test_engine_replay_checks_its_output_dir_before_loading_the_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.setattr(sim.cli.engine, "_engine_modules", lambda: pytest.fail("engine loaded"))
    blocker = write(tmp_path, "", "blocker")
    code, out, err = cli(capsys, "engine", "replay", str(write(tmp_path, SMALL)),
                         "--out", str(blocker))
    assert_user_error(code, out, err, "--out", "is a file")


@pytest.mark.parametrize("argv", [
    ["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out", "{blocker}"],
    ["calibrate", "profile", "--model", "tiny", "--device", "cpu", "--out", "{blocker}/t"],
    ["calibrate", "validate", "{scenario}", "--table", "x", "--out", "{blocker}"],
    ["calibrate", "fit", "{blocker}"],
], ids=["profile", "profile-inside-a-file", "validate", "fit"])
def test_calibrate_checks_its_directories_before_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        argv: list[str]) -> None:
    pytest.importorskip("torch")
    import calibrate.fit
    import calibrate.profile.run
    import calibrate.validate

    for module, name in ((calibrate.profile.run, "profile_engine"),
                         (calibrate.validate, "validate_file"), (calibrate.fit, "fit_table")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("the work started"))
    blocker = write(tmp_path, "", "blocker")
    scenario = write(tmp_path, SMALL)
    args = [a.format(blocker=blocker, scenario=scenario) for a in argv]
    code, out, err = cli(capsys, *args)
    assert_user_error(code, out, err, "is a file")


# -- scenario mistakes ---------------------------------------------------------------

CASES = {
    "name outside results": ("name: ../x\n" + SMALL, (), "name: must be a plain directory name"),
    "deep nesting": ("a: " + "[" * 3000 + "]" * 3000 + "\n", (), "nested too deeply"),
    "deep --set": (SMALL, ("seed=" + "[" * 100 + "]" * 100,), "nested more than 32 levels"),
    "5000-digit integer": ("seed: 1" + "0" * 5000 + "\n" + SMALL, (), "more than 4300 digits"),
    "huge hex integer": ("seed: 0x" + "f" * 5000 + "\n" + SMALL, (), "seed: an integer of"),
    "30-digit count": (SMALL, ("workload.num_requests=" + "1" * 30,),
                       "workload.num_requests: an integer of 30 digits is out of range"),
    "count beyond the ceiling": (SMALL, ("workload.num_requests=20000000",),
                                 "workload.num_requests: 20000000 is more than servesim"),
    "duration beyond the ceiling": (SMALL, ("workload.num_requests=null",
                                            "workload.duration_s=1e9"), "workload.duration_s"),
    "block above the context": (SMALL, ("kv.block_size=100000",),
                                "kv.block_size: 100000 tokens per block exceeds the longest"),
    "block above max_model_len": (SMALL, ("scheduler.max_model_len=64", "kv.block_size=128"),
                                  "longest sequence, 64 tokens"),
    "pool too large to hold": (SMALL, ("kv.num_blocks=1000000000000",), "kv.num_blocks"),
    "fleet too large": (SMALL, ("replicas=100000",), "replicas"),
    "negative seed": (SMALL, ("seed=-1",), "seed: Input should be greater than or equal to 0"),
    "infinite swap space": (SMALL, ("kv.host_swap_gib=.inf",), "kv.host_swap_gib"),
    "alias loop": ("a: &x [*x]\n" + SMALL, (), "contains itself"),
    "alias bomb": ("".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n"
                           for i in range(1, 9)).replace("*l0", "x") + SMALL, (),
                   "more than 1,000,000 values"),
    "compare spec given to run": (SPEC, (), "compare spec (it has variants)"),
}


@pytest.mark.parametrize("text, overrides, expected", CASES.values(), ids=CASES)
def test_scenario_mistakes_exit_2_with_one_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        no_work: None, text: str, overrides: tuple[str, ...], expected: str) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["run", str(write(tmp_path, text))]
    for item in overrides:
        args += ["--set", item]
    code, out, err = cli(capsys, *args)
    assert_user_error(code, out, err, expected)
    assert not (tmp_path / "results").exists() and not (tmp_path.parent / "x").exists()


def test_run_on_a_compare_spec_names_the_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, SPEC, "c.yaml")
    assert_user_error(*cli(capsys, "run", str(spec)), f"servesim compare {spec}")


def test_compare_on_a_scenario_names_the_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None) -> None:
    path = write(tmp_path, SMALL)
    code, out, err = cli(capsys, "compare", str(path))
    assert_user_error(code, out, err, "this is a scenario", f"servesim run {path}")
    assert "unknown key" not in err


def test_compare_name_may_not_leave_results(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None) -> None:
    path = write(tmp_path, "name: " + "../" * 2 + "x\n" + SPEC, "c.yaml")
    assert_user_error(*cli(capsys, "compare", str(path)), "must be a plain directory name")


def test_an_empty_file_does_not_overwrite_the_quickstart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results" / "quickstart"
    results.mkdir(parents=True)
    (results / "summary.json").write_text("mine")
    assert_user_error(*cli(capsys, "run", str(write(tmp_path, "# empty\n"))), "is empty")
    assert (results / "summary.json").read_text() == "mine"


# -- what a run leaves behind --------------------------------------------------------

def test_one_run_per_directory_with_its_provenance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, out = write(tmp_path, SMALL), tmp_path / "out"
    assert cli(capsys, "run", str(path), "--out", str(out), "--timeline", "8", "--quiet")[0] == 0
    assert (out / "timeline.csv").is_file()
    assert cli(capsys, "run", str(path), "--out", str(out), "--quiet", "--no-plots")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == [".servesim-manifest.json", "requests.csv",
                                                     "summary.json", "timeseries.csv"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".servesim-")]
    stamp = json.loads((out / "summary.json").read_text())["provenance"]
    assert stamp["servesim_version"] == __version__
    assert stamp["scenario_schema_version"] == SCHEMA_VERSION
    assert stamp["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", stamp["git_commit"])


def test_provenance_without_git(monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.results.files.provenance import git_commit, provenance

    monkeypatch.setenv("PATH", "")  # no git to run
    assert git_commit() == (None, None)
    assert provenance()["git_commit"] is None


def test_provenance_finds_the_commit_of_this_checkout() -> None:
    """Run from a git checkout of servesim (as CI and `pip install -e` are), the stamp names
    the checkout's HEAD: the module must find the checkout's root from where it lives."""
    import subprocess

    from sim.results.files.provenance import git_commit

    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=False)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert git_commit()[0] == head.stdout.strip()


def test_provenance_of_a_package_inside_another_repository(tmp_path: Path) -> None:
    from sim.results.files.provenance import git_commit

    assert git_commit(tmp_path) == (None, None)


def test_set_overrides_get_their_own_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """`run routing.yaml` and `run routing.yaml --set router.policy=...` keep both results."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "name: fleet\nreplicas: 2\n" + SMALL)
    for extra in ([], ["--set", "router.policy=least_outstanding"]):
        assert cli(capsys, "run", str(path), "--quiet", "--no-plots", *extra)[0] == 0
    policies = {p.name: json.loads((p / "summary.json").read_text())["replicas"][0]["requests"]
                for p in (tmp_path / "results").iterdir()}
    assert set(policies) == {"fleet", "fleet+router.policy=least_outstanding"}


def test_engine_replay_modes_get_their_own_directories() -> None:
    from sim.cli.engine import replay_dir

    names = {replay_dir("e", [], None, False), replay_dir("e", [], None, True),
             replay_dir("e", [], "cpu", False), replay_dir("e", ["seed=1"], None, True)}
    assert len(names) == 4
    assert replay_dir("e", [], None, False) == Path("results/e_engine")


# -- Ctrl-C and closed pipes, in process -----------------------------------------------

def test_ctrl_c_exits_130_with_one_line_and_keeps_the_old_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    from sim.results.files.manifest import write_manifest

    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("old")
    write_manifest(out, "run")  # an earlier run's result

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.experiments.run, "run_scenario", interrupted)
    code, stdout, err = cli(capsys, "run", str(write(tmp_path, SMALL)), "--out", str(out))
    assert (code, stdout, err) == (130, "", "interrupted\n")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".servesim-")] == []
    assert (out / "summary.json").read_text() == "old"


def test_a_closed_pipe_ends_quietly(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    import sim.cli.schema_doc

    def closed(docs: object) -> str:
        raise BrokenPipeError

    monkeypatch.setattr(sim.cli.schema_doc, "format_schema", closed)
    assert main(["schema"]) == 141
    assert capsys.readouterr().err == ""

