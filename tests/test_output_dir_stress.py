"""Ten concurrent `servesim run`s into one directory, a few rounds: each commits a whole
result or exits 2 naming the run that holds the directory, and the directory ends as one
run's complete files (benchmarks/output_dir_stress.py; `--rounds 25` there for more)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_stress():  # noqa: ANN201 - the benchmark module
    spec = importlib.util.spec_from_file_location(
        "output_dir_stress", ROOT / "benchmarks" / "output_dir_stress.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


stress = load_stress()


@pytest.mark.skipif(not stress.SERVESIM.exists(), reason="no servesim console script")
def test_ten_concurrent_runs_into_one_directory(tmp_path: Path) -> None:
    rounds = stress.stress(tmp_path, rounds=3, runs=10)
    for seen in rounds:
        assert set(seen.codes) <= {0, 2}
    assert stress.check_directory(tmp_path / "race") == rounds[-1].winner_requests


def test_the_checks_catch_a_mixed_directory(tmp_path: Path) -> None:
    """The stress test can fail: a file of another run, or a missing one, is caught."""
    out = tmp_path / "race"
    done = subprocess.run([str(stress.SERVESIM), "run", "--set", "workload.num_requests=20",
                           "--out", str(out), "--quiet", "--no-plots"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert stress.check_directory(out) == 20
    shutil.copy(out / "requests.csv", tmp_path / "keep.csv")
    (out / "requests.csv").write_text((out / "requests.csv").read_text().rsplit("\n", 2)[0])
    with pytest.raises(AssertionError, match="requests.csv"):
        stress.check_directory(out)  # a file cut short (or another run's)
    shutil.copy(tmp_path / "keep.csv", out / "requests.csv")
    (out / "timeline.csv").write_text("an earlier run's\n")
    with pytest.raises(AssertionError):
        stress.check_directory(out)  # a file no manifest lists
