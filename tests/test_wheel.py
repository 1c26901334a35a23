"""The built wheel works outside this checkout: package data and path arithmetic.

The suite imports the project from the checkout (an editable install), where a file that
the wheel leaves out, or a path counted from the wrong folder, still resolves. So the
wheel is built from a copy of the sources, installed into a scratch venv that sees this
venv's third-party packages but not the checkout, and run from an empty folder:
- `python -m calibrate.gpu.check --help`, the GPU machine's entry point;
- the GPU check's committed replay plans (calibrate/gpu/plans/*.json) found where
  calibrate.gpu.plan looks, and equal to what the scenarios give (`--check`), which also
  reads the shipped model configs and traces as package data;
- `servesim --help` from the installed console script.
And the check run as a file (`python calibrate/gpu/check.py`), which puts its checkout
on sys.path itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "sim", "gpu_engine", "calibrate")


def run(args: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False, **kw)


def bare_venv(where: Path) -> Path:
    """A scratch venv's python that sees this venv's third-party packages (torch, numpy,
    pydantic ...) but not the checkout: a path named in a .pth file is added as it is, so
    the editable-install hook that makes the checkout importable here is not run there."""
    made = run([sys.executable, "-m", "venv", "--without-pip", str(where)], cwd=where.parent)
    assert made.returncode == 0, made.stderr
    python = where / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    cwd=where).stdout.strip())
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "outer_venv.pth").write_text("\n".join(sorted(ours)) + "\n")
    gone = run([str(python), "-c", "import calibrate"], cwd=where)
    assert gone.returncode != 0, "the checkout is importable from a bare venv"
    return python


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare venv's python with the wheel installed (no dependencies of its own)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(ROOT / name, src / name)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--no-index", "-q", "-w", str(base / "dist"), str(src)], cwd=base)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next((base / "dist").glob("servesim-*.whl"))
    python = bare_venv(base / "venv")
    done = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                "--no-index", "-q", str(wheel)], cwd=base)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def test_the_gpu_check_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    done = run([str(installed), "-m", "calibrate.gpu.check", "--help"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m calibrate.gpu.check" in done.stdout
    where = run([str(installed), "-c", "import calibrate, sim, gpu_engine\n"
                 "for m in (calibrate, sim, gpu_engine): print(m.__file__)"], cwd=tmp_path)
    venv = installed.parent.parent
    assert where.returncode == 0, where.stderr
    assert all(Path(f).is_relative_to(venv) for f in where.stdout.split()), where.stdout


def test_the_wheel_carries_the_plans_and_the_data_they_are_made_from(
        installed: Path, tmp_path: Path) -> None:
    plans = run([str(installed), "-c", "from calibrate.gpu.plan import PLAN_DIR\n"
                 "print(PLAN_DIR); print(sorted(p.name for p in PLAN_DIR.glob('*.json')))"],
                cwd=tmp_path)
    assert plans.returncode == 0, plans.stderr
    plan_dir, names = plans.stdout.splitlines()
    assert Path(plan_dir).is_relative_to(installed.parent.parent)
    assert names == str(sorted(p.name for p in (ROOT / "calibrate/gpu/plans").glob("*.json")))
    check = run([str(installed), "-m", "calibrate.gpu.plan", "--check"], cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_console_script_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    done = run([str(installed.with_name("servesim")), "--help"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage: servesim" in done.stdout


def test_the_gpu_check_run_as_a_file_finds_its_checkout(tmp_path: Path) -> None:
    python = bare_venv(tmp_path / "venv")
    done = run([str(python), str(ROOT / "calibrate" / "gpu" / "check.py"), "--help"],
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
