"""The repository stands on its own: no tracked file names a path outside it.

A user's clone has nothing beside it, so a scenario, notebook, doc, benchmark,
test or module that reads a sibling folder, climbs above the checkout with
`..` or `Path(__file__).parents[k]`, or names an absolute path of the machine
it was written on, works here and fails there.

One file is exempt: `.ci/run` copies third-party measurements that may not be
committed from the shared folder beside the checkout into the clone's gitignored
folders (when that folder is there), so the tests that need them run in CI and skip
elsewhere.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIBLING = "shared"  # the workspace folder beside the checkout that a user never has
UP2 = "../" * 2  # written so, as the examples below must not trip the check on this file
_ABSOLUTE = re.compile(r"(?<![\w.~/-])/" + "work" + r"(?:/|\b)")
_SIBLING = re.compile(r"\.\./" + SIBLING + r"\b")
_CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+|(?:\.\.\\\\)+)")
_PARENTS = re.compile(r"parents\[(\d+)\]")
EXEMPT = (Path(".ci/run"),)


def tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return [ROOT / name for name in listed.split("\0") if name]


def problems(relative: Path, text: str) -> list[str]:
    """Each place in `text` (the file at `relative`) that names a path outside the repo."""
    depth = len(relative.parent.parts)  # how many `..` stay inside, from the file's folder
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{relative}:{number}: {line.strip()[:120]}"
        if _SIBLING.search(line) or _ABSOLUTE.search(line):
            found.append(where)
            continue
        climbs = [m.group(1).count("..") for m in _CLIMB.finditer(line)]
        # parents[k] of a file is k + 1 folders up: parents[depth] is the repository root
        parents = [int(k) for k in _PARENTS.findall(line)] if relative.suffix == ".py" else []
        if any(n > depth for n in climbs) or any(k > depth for k in parents):
            found.append(where)
    return found


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file() or path.relative_to(ROOT) in EXEMPT:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images and other binaries name no paths
        found += problems(path.relative_to(ROOT), text)
    assert found == [], "paths outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize(("relative", "line"), [
    ("scenarios/x.yaml", "path: " + UP2 + SIBLING + "/traces/a.csv"),
    ("README.md", "see [DESIGN](../" + SIBLING + "/DESIGN.md)"),
    ("README.md", "see [x](../other/x.md)"),
    ("notebooks/n.ipynb", '"trace": "' + UP2 + 'data/a.csv"'),
    ("tests/test_x.py", "TRACES = Path(__file__).resolve().parents" + "[2] / 'traces'"),
    ("calibrate/x.py", 'OUT = "/' + 'work/out"'),
])
def test_the_check_catches_each_way_out(relative: str, line: str) -> None:
    assert problems(Path(relative), line) != []


@pytest.mark.parametrize(("relative", "line"), [
    ("scenarios/x.yaml", "base: ../scenarios/routing.yaml"),
    ("notebooks/n.ipynb", '"path": "../scenarios/quickstart.yaml"'),
    ("tests/test_x.py", "ROOT = Path(__file__).resolve().parents[1]"),
    ("README.md", "sim/workload/data/traces and sim/workload/build.py"),
    ("docs/a.md", "a range like 1..5 or an ellipsis..."),
])
def test_the_check_lets_paths_inside_the_repository_pass(relative: str, line: str) -> None:
    assert problems(Path(relative), line) == []
