"""What made a run: the servesim version, the git commit, the scenario schema version.

Written into every summary.json so a number can be traced to the code that
produced it. The commit is read from the checkout's git files (no process to
start: a run's start-up is short and a `git` call costs milliseconds); whether
tracked files differ from it costs one `git diff-index`. Without git, or when
servesim is installed outside its own checkout, both are null.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from sim import __version__
from sim.config.scenario import SCHEMA_VERSION

_ROOT = Path(__file__).resolve().parents[3]  # the checkout, for an editable install
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 object names


def git_commit(root: Path = _ROOT) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout at `root`.

    (None, None) when git is absent, `root` is no checkout (it has no `.git` of its own,
    e.g. a virtualenv inside some other project's repository) or HEAD has no commit.
    """
    if not (root / ".git").exists():
        return None, None
    try:
        head = _head_from_files(root) or _head_from_git(root)
        if head is None:
            return None, None
        dirty = subprocess.run(["git", "-C", str(root), "diff-index", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head, None if dirty.returncode not in (0, 1) else dirty.returncode == 1


def _head_from_files(root: Path) -> str | None:
    """HEAD's commit as git stores it: in HEAD (detached), else in its branch's ref, a loose
    file or a line of packed-refs, which a linked worktree keeps in the common folder.
    None for any other layout (a reftable repository), which `git` itself then reads."""
    dot_git = root / ".git"
    try:
        git_dir = dot_git if dot_git.is_dir() else (
            root / dot_git.read_text().removeprefix("gitdir:").strip())  # a worktree's link
        head = (git_dir / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head if _SHA.fullmatch(head) else None
        ref = head.removeprefix("ref: ")
        common = git_dir / ((git_dir / "commondir").read_text().strip()
                            if (git_dir / "commondir").is_file() else ".")
        for folder in (git_dir, common):
            if (folder / ref).is_file():
                sha = (folder / ref).read_text().strip()
                return sha if _SHA.fullmatch(sha) else None
        packed = common / "packed-refs"
        lines = packed.read_text().splitlines() if packed.is_file() else []
    except (OSError, UnicodeDecodeError):
        return None
    found = [sha for sha, _, name in (line.partition(" ") for line in lines) if name == ref]
    return found[0] if found and _SHA.fullmatch(found[0]) else None


def _head_from_git(root: Path) -> str | None:
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "-q", "HEAD"],
                          capture_output=True, text=True, timeout=10, check=False)
    sha = head.stdout.strip()
    return sha if head.returncode == 0 and _SHA.fullmatch(sha) else None


def provenance() -> dict[str, Any]:
    """The summary's `provenance` block."""
    commit, dirty = git_commit()
    return {"servesim_version": __version__, "git_commit": commit, "git_dirty": dirty,
            "scenario_schema_version": SCHEMA_VERSION}
