"""What made a run: the servesim version, the git commit, the scenario schema version.

Written into every summary.json so a number can be traced to the code that
produced it. The commit costs two `git` calls of a few milliseconds; without
git, or when servesim is installed outside its own checkout, it is null.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from sim import __version__
from sim.config.scenario import SCHEMA_VERSION

_ROOT = Path(__file__).resolve().parents[2]  # the checkout, for an editable install


def git_commit(root: Path = _ROOT) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout at `root`.

    (None, None) when git is absent, `root` is no checkout, or `root` merely sits
    inside some other repository (a virtualenv in a project folder).
    """
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
        lines = head.stdout.split("\n")
        if head.returncode != 0 or len(lines) < 2 or Path(lines[0]).resolve() != root:
            return None, None
        dirty = subprocess.run(["git", "-C", str(root), "diff-index", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None, None
    return lines[1], None if dirty.returncode not in (0, 1) else dirty.returncode == 1


def provenance() -> dict[str, Any]:
    """The summary's `provenance` block."""
    commit, dirty = git_commit()
    return {"servesim_version": __version__, "git_commit": commit, "git_dirty": dirty,
            "scenario_schema_version": SCHEMA_VERSION}
