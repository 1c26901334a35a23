"""Ctrl-C and closed pipes on the real `servesim` process: exit codes, one line, nothing left.

The interrupt is sent once the run is under way (its staging directory exists), to the
whole process group as a terminal does, so loky's workers get it too. No test reads the
clock: the timeouts only stop a hung process.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SERVESIM = Path(sys.executable).parent / "servesim"
LONG = """
name: long
workload:
  arrivals: {process: poisson, rate: 8}
  prompt_tokens: {dist: fixed, value: 200}
  output_tokens: {dist: fixed, value: 50}
  num_requests: 5000000
"""
LONG_SPEC = """
scenario:
  workload:
    arrivals: {process: poisson, rate: 8}
    prompt_tokens: {dist: fixed, value: 200}
    output_tokens: {dist: fixed, value: 50}
    num_requests: 5000000
variants:
  - {name: a, set: {scheduler.max_num_seqs: 64}}
  - {name: b, set: {scheduler.max_num_seqs: 128}}
rates: [4, 8]
"""


def staging(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(".servesim-")]


def interrupt_when_under_way(argv: list[str], parent: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([str(SERVESIM), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        while not staging(parent):  # the output directory was checked; the work begins
            try:
                proc.wait(timeout=0.05)  # a poll, not a measurement
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"servesim ended before the work began: {proc.communicate()}")
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("command", ["run", "compare"])
def test_ctrl_c_stops_with_130_one_line_and_no_partial_directory(
        tmp_path: Path, command: str) -> None:
    from sim.results.files.manifest import write_manifest

    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("old")
    write_manifest(out, command)  # an earlier result of the same command
    path = tmp_path / "s.yaml"
    path.write_text(LONG if command == "run" else LONG_SPEC)
    extra = ["--jobs", "2"] if command == "compare" else []
    done = interrupt_when_under_way([command, str(path), "--out", str(out), *extra], tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "interrupted"
    for noise in ("Traceback", "KeyboardInterrupt", "leaked", "Warning"):
        assert noise not in done.stderr, done.stderr
    assert staging(tmp_path) == []
    assert (out / "summary.json").read_text() == "old"


def test_ctrl_c_while_numpy_random_loads_is_not_lost(tmp_path: Path) -> None:
    """numpy.random's Cython modules drop an error raised while they register with
    collections.abc: a Ctrl-C landing there used to be lost and the run went on. Here the
    Ctrl-C lands exactly there (ABCMeta.register wrapped to raise it) in a short run."""
    path = tmp_path / "s.yaml"
    path.write_text(LONG.replace("5000000", "2000"))
    code = f"""
import abc, signal, sys
register, hit = abc.ABCMeta.register, []
def register_interrupted(cls, subclass):
    if getattr(subclass, "__module__", "") == "numpy.random._generator" and not hit:
        hit.append(1)
        print("ctrl-c now", file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGINT)
    return register(cls, subclass)
abc.ABCMeta.register = register_interrupted
sys.argv = ["servesim", "run", {str(path)!r}, "--out", {str(tmp_path / "out")!r}, "--quiet"]
from sim.cli import console
console()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    if "ctrl-c now" not in done.stderr:
        pytest.skip("this numpy.random registers nothing with collections.abc as it loads")
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "interrupted"
    assert not (tmp_path / "out").exists()
    assert staging(tmp_path) == []


def test_a_ctrl_c_that_some_code_swallows_is_raised_again(tmp_path: Path) -> None:
    """A Ctrl-C landing where an exception is dropped (here a progress update that swallows
    it, as a finaliser or some C code would) is raised again a CPU second later
    (sim.cli.interrupts): the 5M-request run stops with 130, not hours later."""
    path = tmp_path / "s.yaml"
    path.write_text(LONG)
    code = f"""
import signal, sys
from sim.experiments.progress import DelayedBar
update, calls = DelayedBar.update, []
def update_swallowing_ctrl_c(self, n=1):
    calls.append(n)
    if len(calls) == 100:
        try:
            signal.raise_signal(signal.SIGINT)
            sum(range(10))  # the handler runs here, inside the try
        except KeyboardInterrupt:
            print("ctrl-c swallowed", file=sys.stderr, flush=True)
    update(self, n)
DelayedBar.update = update_swallowing_ctrl_c
sys.argv = ["servesim", "run", {str(path)!r}, "--out", {str(tmp_path / "out")!r}]
from sim.cli import console
console()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "ctrl-c swallowed" in done.stderr, done.stderr
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    assert staging(tmp_path) == []


def test_an_interrupt_being_handled_is_not_raised_again() -> None:
    """The repeat leaves a command's clean-up alone: while a KeyboardInterrupt (or an error
    raised from one) is being handled, the timer's signal raises nothing."""
    from sim.cli import interrupts

    assert not interrupts.caused_by_interrupt(None)
    assert not interrupts.caused_by_interrupt(ValueError("x"))
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        try:
            raise RuntimeError("clean-up failed")
        except RuntimeError as err:
            assert interrupts.caused_by_interrupt(err)
            interrupts._again(signal.SIGVTALRM, None)  # raises nothing here
    with pytest.raises(KeyboardInterrupt):
        interrupts._again(signal.SIGVTALRM, None)


def test_a_ctrl_c_dropped_in_a_weakref_callback_prints_no_traceback() -> None:
    """Python reports an exception raised in a weakref callback ("Exception ignored in",
    with its traceback) and goes on: a Ctrl-C landing there (an import lock's callback,
    seen under load) is dropped quietly, for the timer raises it again; anything else
    dropped there is still reported."""
    script = """
import sys, weakref
from sim.cli import interrupts
interrupts.install()
class Held: pass
def dropping(error):
    def callback(_ref):
        raise error
    return callback
for error in (KeyboardInterrupt, ValueError("reported")):
    held = Held()
    ref = weakref.ref(held, dropping(error))
    del held
print("went on")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == "went on\n", done.stderr
    assert done.stderr.count("Exception ignored") == 1, done.stderr
    assert "ValueError: reported" in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_a_worker_takes_no_semaphore_for_its_progress_bars() -> None:
    """A killed worker leaks what it holds: a bar's default multiprocessing lock would be
    one (Python warns of leaked semaphores at exit after Ctrl-C)."""
    code = """
import threading
from pathlib import Path
from tqdm import tqdm
from sim.config.loader import validate_scenario
from sim.experiments.sweep import Task, run_task
scenario = validate_scenario({"workload": {"arrivals": {"process": "poisson", "rate": 4},
    "prompt_tokens": {"dist": "fixed", "value": 50}, "output_tokens": {"dist": "fixed",
    "value": 5}, "num_requests": 5}}, "test")
assert "error" not in run_task(Task(scenario, Path.cwd()))
print(type(tqdm.get_lock()).__module__)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() != "tqdm.std", "a worker's bars took a multiprocessing lock"


@pytest.mark.parametrize("argv", [["capacity", "--model", "llama-3-8b"], ["schema"],
                                  ["explain", "{run}", "--slowest", "50"]])
def test_a_reader_that_stops_early_gets_no_broken_pipe_error(
        tmp_path: Path, argv: list[str]) -> None:
    """`servesim explain RUN | head`: the pipe's reader has gone before servesim writes."""
    run_dir = tmp_path / "run"
    if "{run}" in argv:
        subprocess.run([str(SERVESIM), "run", "--out", str(run_dir), "--quiet", "--no-plots",
                        "--set", "workload.num_requests=100"], check=True, timeout=120)
    read, write = os.pipe()
    os.close(read)  # no reader: every write fails with EPIPE, deterministically
    try:
        done = subprocess.run([str(SERVESIM), *(a.format(run=run_dir) for a in argv)],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              check=False)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_an_error_raised_while_handling_ctrl_c_is_still_an_interrupt(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C that lands while joblib starts its pool makes joblib's clean-up raise its own
    error from the KeyboardInterrupt: the user pressed Ctrl-C, so it is exit 130, one line."""
    import sim.cli as cli

    def interrupted_in_clean_up(args: object) -> int:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot join thread before it is started") from None

    def other_error(args: object) -> int:
        raise RuntimeError("a real bug")

    commands = [interrupted_in_clean_up]

    class Parser:
        def __init__(self, command: str | None = None) -> None:
            pass

        def parse_args(self, argv: object) -> argparse.Namespace:
            return argparse.Namespace(func=commands[-1])

    monkeypatch.setattr(cli, "build_parser", Parser)
    assert cli.main([]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted"
    commands.append(other_error)
    with pytest.raises(RuntimeError, match="a real bug"):
        cli.main([])
