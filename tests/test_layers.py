"""benchmarks/layers.py: the house stands on at most 8 layers with no cycle, and it can tell.

Its graph functions are checked on small graphs whose answers are known; the script then
measures this checkout, and a copy of it with one import that runs the wrong way.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "layers.py"
sys.path.insert(0, str(SCRIPT.parent))

from layers import child_edges, cycles, house_child, inside, longest_chain  # noqa: E402


def graph(*pairs: str) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for pair in pairs:
        a, b = pair.split(">")
        out.setdefault(a, set()).add(b)
    return {k: frozenset(v) for k, v in out.items()}


def test_cycles_are_the_sets_that_import_each_other_round() -> None:
    assert cycles(graph("a>b", "b>c", "a>c")) == []
    assert cycles(graph("a>b", "b>a", "c>a")) == [["a", "b"]]
    assert cycles(graph("a>b", "b>c", "c>a", "d>e", "e>d", "c>d")) == [["a", "b", "c"],
                                                                       ["d", "e"]]


def test_the_longest_chain_counts_the_nodes_one_path_passes() -> None:
    assert longest_chain(graph("a>b", "b>c", "a>c", "d>c")) == ["a", "b", "c"]
    assert longest_chain(graph("x>y")) == ["x", "y"]
    assert longest_chain({}) == []
    deep = graph(*(f"n{i}>n{i + 1}" for i in range(3000)))  # no recursion limit
    assert len(longest_chain(deep)) == 3001


def test_imports_fold_onto_the_children_of_a_container() -> None:
    imports = [("sim.results.files.summary", "sim.results.record.recorder"),
               ("sim.results.record.recorder", "sim.results.record.batches"),
               ("sim.results.record.batches", "sim.results.stats.sketch"),
               ("sim.results.files.summary", "sim.config.scenario")]
    assert child_edges(imports, inside("sim.results")) == graph(
        "sim.results.files>sim.results.record", "sim.results.record>sim.results.stats")
    assert child_edges(imports, house_child) == graph("sim.results>sim.config")
    assert house_child("gpu_engine.engine") == "gpu_engine"
    assert house_child("sim.assemble") == "sim.assemble"


def run(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo)], cwd=repo,
                          capture_output=True, text=True, timeout=300, check=False)


def test_this_checkout_stands_on_at_most_eight_layers_with_no_cycle() -> None:
    done = run(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    house = next(line for line in done.stdout.splitlines() if line.startswith("the house:"))
    assert int(house.split()[2]) <= 8, house


def test_an_import_that_runs_back_is_caught(tmp_path: Path) -> None:
    for package in ("sim", "gpu_engine", "calibrate"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "data"))
    (tmp_path / "sim/results/stats/bad.py").write_text("import sim.results.files.summary\n")
    done = run(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "sim.results: 1 cycle(s): sim.results.files <-> sim.results.record <-> " \
           "sim.results.stats" in done.stdout
