"""The `servesim` process keeps the cyclic collector off while it starts (sim.cli.start_up):
no collection until the scenario is read, what start-up built frozen out of later ones, the
collector back on for the work; an in-process caller's collector is left as it was. Nor does
it scan the installed distributions for pydantic plugins."""

import json
import os
import subprocess
import sys
from pathlib import Path

# console() as the console script runs it, with started() watched: how many collections ran
# before it, what was loaded by then, and the collector's state after it
WATCHED = """
import gc, json, os, sys
from pathlib import Path
from sim.cli import console, start_up

collections = [0]
gc.callbacks.append(lambda phase, info: phase == "start" and collections.__setitem__(
    0, collections[0] + 1))
seen = {}
real_started = start_up.started

def watched():
    seen.setdefault("collections_before", collections[0])
    seen.setdefault("schema_loaded", "sim.config.scenario" in sys.modules)
    seen.setdefault("blas_threads", os.environ.get("OPENBLAS_NUM_THREADS"))
    tasks = Path("/proc/self/task")  # Linux: the process's threads
    seen.setdefault("threads", len(list(tasks.iterdir())) if tasks.exists() else None)
    real_started()
    seen.setdefault("enabled_after", gc.isenabled())
    seen.setdefault("frozen_after", gc.get_freeze_count())

start_up.started = watched
sys.argv = ["servesim", *sys.argv[1:]]
try:
    console()
finally:
    loader = sys.modules.get("pydantic.plugin._loader")
    seen["plugins_scanned"] = loader is not None and loader._plugins is not None
    print(json.dumps(seen))
"""


def _console(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", WATCHED, *argv], capture_output=True,
                         text=True, check=False, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_run_starts_without_collections_and_then_collects(tmp_path: Path) -> None:
    seen = _console(tmp_path, "run", "--no-plots", "--quiet", "--set",
                    "workload.num_requests=20", "--out", str(tmp_path / "out"))
    assert seen["schema_loaded"], "start-up ended before the scenario was read"
    assert seen["collections_before"] == 0
    assert seen["enabled_after"] is True
    assert seen["frozen_after"] > 10_000  # the modules and the schema, out of later walks
    assert seen["plugins_scanned"] is False
    assert (tmp_path / "out" / "summary.json").exists()


def test_numpy_loads_with_one_blas_thread_unless_the_user_asks_for_more(tmp_path: Path) -> None:
    argv = ("run", "--no-plots", "--quiet", "--set", "workload.num_requests=20", "--out")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    seen = _console(tmp_path, *argv, str(tmp_path / "a"), env=env)
    assert seen["blas_threads"] == "1"
    assert seen["threads"] in (1, None)  # numpy is loaded: no OpenBLAS thread beside this one
    seen = _console(tmp_path, *argv, str(tmp_path / "b"), env={**env, "OPENBLAS_NUM_THREADS": "2"})
    assert seen["blas_threads"] == "2"


def test_every_other_command_collects_from_its_start(tmp_path: Path) -> None:
    """A command that does not say when its start-up ends gets the collector back at once."""
    seen = _console(tmp_path, "capacity", "--model", "llama-3-8b")
    assert seen["collections_before"] == 0
    assert seen["schema_loaded"] is False  # right after parsing, before the command ran
    assert seen["enabled_after"] is True


def test_main_in_process_leaves_the_collector_as_it_was(tmp_path: Path) -> None:
    code = (
        "import gc\nfrom sim.cli import main\n"
        "before = gc.get_freeze_count()\n"
        f"main(['run', '--no-plots', '--quiet', '--set', 'workload.num_requests=20', "
        f"'--out', {str(tmp_path / 'out')!r}])\n"
        "print(gc.isenabled(), gc.get_freeze_count() == before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["True", "True"]
