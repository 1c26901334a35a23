"""Where results may go: a result directory's name, its path checks and its content check.

Pure checks, made before any work (a file in the way, no write permission, a name the file
system refuses) and again under the directory's lock (what it holds): a mistake costs no
simulation, and nothing here creates or deletes anything. sim.results.files.output_dir
stages and commits; this module only says yes or no, with a message naming the field.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from sim.results.files.dir_lock import name_max
from sim.results.files.manifest import MANIFEST, foreign_entry, read_manifest

SHOWN_NAME_CHARS = 60


class OutputDirError(Exception):
    """The output directory cannot take the results: a user mistake, exit code 2."""


def short_name(name: str) -> str:
    """A file name cut to SHOWN_NAME_CHARS for a message."""
    return name if len(name) <= SHOWN_NAME_CHARS else name[:SHOWN_NAME_CHARS - 3] + "..."


def variant_dir(name: str, overrides: Sequence[str] = (), suffix: str = "") -> Path:
    """results/<name><suffix>, plus the `--set` overrides: one directory per variant.

    `servesim run routing.yaml --set router.policy=prefix_aware` goes to
    results/routing+router.policy=prefix_aware/, so it never replaces the plain
    run's results/routing/. Long override lists end in a hash to fit a file name.
    """
    label = name + suffix
    if overrides:
        parts = [f"{key.strip()}={value.strip()}" for key, _, value in
                 (item.partition("=") for item in overrides)]
        tail = re.sub(r"[^A-Za-z0-9._=,+-]", "_", "+".join(parts))
        if len(tail) > 100:
            digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
            tail = f"{tail[:80]}-{digest}"
        label += "+" + tail
    return Path("results") / label


def check_output_dir(path: Path, field: str, replace: bool = False, command: str | None = None,
                     force: bool = False) -> None:
    """Raise OutputDirError unless `path` can become a directory of results; creates nothing.

    `field` names the setting the path came from (`--out`, `output.dir`, ...).
    `replace`: a run of `command` will replace the directory, so it must hold nothing that
    run may not replace (see `check_contents`); Staging makes this check under its lock.
    """
    shown = f"{field} {str(path)!r}"
    target = Path(os.path.abspath(path))
    if len(os.fsencode(str(target))) >= 4096:
        raise OutputDirError(f"{shown}: the path is longer than the 4096 bytes a path may have")
    existing = target
    while not os.path.lexists(existing):
        existing = existing.parent
    limit = name_max(existing if existing.is_dir() else existing.parent)
    for part in target.parts:
        if len(os.fsencode(part)) > limit:
            raise OutputDirError(f"{shown}: the name {part[:20]!r}... is {len(os.fsencode(part))} "
                                 f"bytes long; this file system allows at most {limit}")
    if existing != target and not existing.is_dir():
        raise OutputDirError(f"{shown}: {str(existing)!r} is a file, so no directory can be "
                             "made inside it")
    if existing == target:
        if not target.is_dir():
            raise OutputDirError(f"{shown}: is a file, not a directory; give a directory")
        if not os.access(target, os.W_OK | os.X_OK):
            raise OutputDirError(f"{shown}: the directory is not writable")
        if replace:
            check_contents(target, shown, command, force)
        existing = target.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"{shown}: {str(existing)!r} is not writable")


def check_contents(target: Path, shown: str, command: str | None, force: bool) -> None:
    """Raise OutputDirError unless a run of `command` may replace `target` (absent or a
    directory): empty, or only files its manifest lists, written by `command` (None: any).
    With `force` anything may be there (its other files are kept at the commit)."""
    if force or not os.path.isdir(target):
        return
    manifest = read_manifest(target)
    if manifest is not None and command is not None and manifest.command != command:
        raise OutputDirError(f"{shown}: holds a `servesim {manifest.command}` result, which "
                             f"`servesim {command}` does not replace; choose another "
                             "directory, or give --force")
    foreign = foreign_entry(target, manifest)
    if foreign is not None:
        why = (f"no {MANIFEST} there lists it" if manifest is not None else
               f"its {MANIFEST} cannot be read" if os.path.lexists(target / MANIFEST) else
               f"the directory has no {MANIFEST} to say what servesim wrote; results "
               "written by an older servesim have none")
        raise OutputDirError(f"{shown}: holds {short_name(foreign)!r}, which servesim did not "
                             f"write ({why});\nchoose another directory, or give --force to "
                             "write there anyway (files servesim did not write are kept)")
