"""summary.json's commit, read from git's files without a git process, is what `git rev-parse
HEAD` says, for each way git stores it: a loose branch ref, packed refs, a detached HEAD and a
linked worktree; and the dirty flag follows the tracked files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sim.results.files.provenance import git_commit

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="no git")


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t",
                          "-c", "init.defaultBranch=main", *args],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "a.txt").write_text("one\n")
    git(root, "add", "a.txt")
    git(root, "commit", "-q", "-m", "first")
    (root / "a.txt").write_text("two\n")
    git(root, "commit", "-q", "-am", "second")
    return root


def test_a_loose_branch_ref_and_the_dirty_flag(repo: Path) -> None:
    assert git_commit(repo) == (git(repo, "rev-parse", "HEAD"), False)
    (repo / "a.txt").write_text("three\n")
    assert git_commit(repo) == (git(repo, "rev-parse", "HEAD"), True)


def test_packed_refs(repo: Path) -> None:
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert git_commit(repo)[0] == git(repo, "rev-parse", "HEAD")


def test_a_detached_head(repo: Path) -> None:
    first = git(repo, "rev-parse", "HEAD~1")
    git(repo, "checkout", "-q", "--detach", first)
    assert git_commit(repo) == (first, False)


def test_a_linked_worktree(repo: Path, tmp_path: Path) -> None:
    git(repo, "pack-refs", "--all")
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked), "HEAD~1")
    assert (linked / ".git").is_file()
    assert git_commit(linked) == (git(linked, "rev-parse", "HEAD"), False)
    assert git_commit(linked)[0] == git(repo, "rev-parse", "HEAD~1")


def test_a_repository_without_commits(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    assert git_commit(tmp_path) == (None, None)


def test_a_folder_inside_a_repository_is_not_a_checkout(repo: Path) -> None:
    (repo / "sub").mkdir()
    assert git_commit(repo / "sub") == (None, None)
