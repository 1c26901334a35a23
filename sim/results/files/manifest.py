"""Which files of a result directory servesim wrote: `.servesim-manifest.json`, and its uses.

Why: replacing a directory used to mean deleting it whole, so a user's notes.txt beside a
run, or a `compare` result under a `run`'s `--out`, went with it. Each commit now lists
the files it wrote (relative paths, sizes, sha256) and the command that wrote them. A
later run replaces only a directory whose every entry that list names, written by the
same command; anything else is refused unless `--force`, and even then the files
servesim did not write are kept (hard-linked into the new directory, so never copied and
never absent). The sizes and digests let a reader check that a directory is one run's
complete file set, nothing mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

MANIFEST = ".servesim-manifest.json"
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Manifest:
    """What one servesim command wrote into a directory."""

    command: str  # e.g. "run", "compare", "engine replay"
    files: frozenset[str]  # relative POSIX paths, the manifest itself left out

    def owns_dir(self, rel: str) -> bool:
        """A directory servesim made: some listed file lies under it."""
        prefix = rel.rstrip("/") + "/"
        return any(name.startswith(prefix) for name in self.files)


def entries(root: Path, below: str = "") -> Iterator[tuple[str, bool]]:
    """(relative path, is a directory) of everything under `root`, sorted, parents first;
    symbolic links are entries, never followed."""
    with os.scandir(root / below if below else root) as listing:
        found = sorted((entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing)
    for name, is_dir in found:
        rel = f"{below}/{name}" if below else name
        yield rel, is_dir
        if is_dir:
            yield from entries(root, rel)


def _digest(path: Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()  # (hashlib.file_digest is Python 3.11+; servesim runs on 3.10)
    with open(path, "rb") as file:
        while chunk := file.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path, command: str,
                   only: Collection[str] | None = None) -> Manifest:
    """List every file now in `directory` (or those of them in `only`) as servesim's, the
    directory being `command`'s result (sizes, sha256)."""
    files = {}
    for rel, is_dir in entries(directory):
        if not is_dir and rel != MANIFEST and (only is None or rel in only):
            path = directory / rel
            if path.is_symlink():
                files[rel] = {"symlink": os.readlink(path)}
            else:
                files[rel] = {"bytes": path.stat().st_size, "sha256": _digest(path)}
    body = {"format": FORMAT, "written_by": f"servesim {command}", "files": files}
    (directory / MANIFEST).write_text(json.dumps(body, indent=1) + "\n")
    return Manifest(command, frozenset(files))


def read_manifest(directory: Path) -> Manifest | None:
    """The directory's manifest; None when it has none (or one servesim cannot read, which
    is no evidence of what servesim wrote)."""
    try:
        body = json.loads((directory / MANIFEST).read_text())
        by = body["written_by"]
        if body["format"] != FORMAT or not by.startswith("servesim "):
            return None
        return Manifest(by.removeprefix("servesim "), frozenset(body["files"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def foreign_entry(directory: Path, manifest: Manifest | None) -> str | None:
    """The first entry of `directory` that servesim did not write (a directory as `name/`),
    None when the manifest names every one."""
    for rel, is_dir in entries(directory):
        if rel == MANIFEST:
            continue
        if manifest is None:
            return rel + "/" if is_dir else rel
        if is_dir and not manifest.owns_dir(rel):
            return rel + "/"
        if not is_dir and rel not in manifest.files:
            return rel
    return None


def keep_others(old: Path, new: Path, manifest: Manifest | None) -> list[str]:
    """Put into `new` every entry of `old` servesim did not write and `new` lacks; returns them.

    Hard links where the file system allows (same inode: nothing copied, and the file is
    never absent from the old directory meanwhile), else a copy.
    """
    kept: list[str] = []
    blocked: list[str] = []  # names the new run took for a file: nothing goes under them
    for rel, is_dir in entries(old):
        if rel == MANIFEST or any(rel.startswith(b + "/") for b in blocked) or (
                manifest is not None and (rel in manifest.files or (
                    is_dir and manifest.owns_dir(rel)))):
            continue
        source, target = old / rel, new / rel
        if os.path.lexists(target):  # the new run wrote this name: its file wins
            if not (is_dir and target.is_dir() and not target.is_symlink()):
                blocked.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if is_dir:
            target.mkdir()
        else:
            try:
                os.link(source, target, follow_symlinks=False)
            except OSError:
                shutil.copy2(source, target, follow_symlinks=False)
        kept.append(rel + "/" if is_dir else rel)
    return kept
