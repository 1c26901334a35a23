"""The import contracts in pyproject.toml hold, and each one can fail.

`lint-imports` checks the house's boundaries in CI. A contract that nothing can
break proves nothing, so each is fed a copy of the code with one deliberate
violation and must report exactly that contract broken, every other kept.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
# every contract's name, in order (tomllib is Python 3.11+; the project runs on 3.10)
CONTRACTS = re.findall(r'^name = "(.+)"$', (ROOT / "pyproject.toml").read_text()
                       .split("[tool.importlinter]")[1], re.MULTILINE)


def lint(root: Path) -> dict[str, bool]:
    """Each contract's name -> kept, as lint-imports reports it for the code under `root`."""
    done = subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=root, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(root)},
                          check=False)
    verdicts = {}
    for name in CONTRACTS:
        line = next((row for row in done.stdout.splitlines() if row.startswith(name)), "")
        verdict = line[len(name):].split()[:1]  # KEPT or BROKEN (then maybe a count)
        assert verdict in (["KEPT"], ["BROKEN"]), f"no verdict for {name!r}:\n{done.stdout}"
        verdicts[name] = verdict == ["KEPT"]
    assert done.returncode == (0 if all(verdicts.values()) else 1), done.stdout + done.stderr
    return verdicts


def copy_of_the_code(tmp_path: Path) -> Path:
    for package in ("sim", "gpu_engine", "calibrate"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_code_keeps_every_contract() -> None:
    assert len(CONTRACTS) == 9
    assert all(lint(ROOT).values())


# (the contract(s) it breaks, as their names begin; files to add: path -> source). An upward
# import between two children that already import downwards also makes a cycle between them.
VIOLATIONS = {
    "core-pydantic": ("sim.core imports nothing", {"sim/core/bad.py": "import pydantic\n"}),
    "sim-torch": ("no module under sim but sim.cli",
                  {"sim/results/files/bad.py": "def f():\n    import torch\n"}),
    "sim-gpu-engine": ("no module under sim but sim.cli",
                       {"sim/experiments/bad.py": "import gpu_engine.engine\n"}),
    "engine-simpy": ("gpu_engine imports no", {"gpu_engine/bad.py": "import simpy\n"}),
    "engine-world": ("gpu_engine imports no",
                     {"gpu_engine/bad.py": "from sim.world.fleet import simulate\n"}),
    "engine-serve": ("gpu_engine imports no",
                     {"gpu_engine/bad.py": "from sim.serve.loop import StepDone\n"}),
    "calibrate-cli": ("nothing imports sim.cli",
                      {"calibrate/gpu/bad.py": "from sim.cli.run import out_dir_of\n"}),
    "plots-world": ("sim.plots never runs", {"sim/plots/bad.py": "import sim.world.fleet\n"}),
    "layers-upward": ("the layers of sim",
                      {"sim/results/files/bad.py": "import sim.plots.canvas\n"}),
    "layers-unplaced": ("the layers of sim", {"sim/flat.py": "import sim.core.plan\n"}),
    "record-files": (("sim.results runs one way", "no import cycles"),
                     {"sim/results/record/bad.py": "import sim.results.files.summary\n"}),
    "stats-recorder": (("sim.results runs one way", "no import cycles"),
                       {"sim/results/stats/bad.py": "import sim.results.record.recorder\n"}),
    "results-unplaced": ("sim.results runs one way",
                         {"sim/results/flat.py": "import sim.results.stats.sketch\n"}),
    "profile-validate": (("calibrate runs one way", "no import cycles"),
                         {"calibrate/profile/bad.py": "import calibrate.validate\n"}),
    "calibrate-unplaced": ("calibrate runs one way",
                           {"calibrate/flat.py": "import calibrate.fit\n"}),
    "cycle": ("no import cycles", {"sim/observe/bad_a.py": "import sim.observe.bad_b\n",
                                   "sim/observe/bad_b.py": "import sim.observe.bad_a\n"}),
}


@pytest.mark.parametrize("case", VIOLATIONS)
def test_each_contract_catches_its_violation(tmp_path: Path, case: str) -> None:
    contracts, files = VIOLATIONS[case]
    expected = (contracts,) if isinstance(contracts, str) else contracts
    root = copy_of_the_code(tmp_path)
    for path, source in files.items():
        (root / path).write_text(source)
    verdicts = lint(root)
    broken = [name for name, kept in verdicts.items() if not kept]
    assert len(broken) == len(expected), broken
    assert all(any(name.startswith(c) for name in broken) for c in expected), broken
