"""Result directories: checked before the work, locked while it runs, swapped in whole.

A command checks its output directory before it simulates anything (a file in
the way, no write permission, a name the file system refuses), so a mistake
costs no work. It then locks the directory (sim.results.files.dir_lock: a second
run into it fails at once, naming the first) and checks what the directory holds
(sim.results.files.manifest): a directory is replaced only when it is empty or
holds exactly the files its `.servesim-manifest.json` says the same command
wrote. Anything else, a user's notes.txt or a `compare` result under `run`, is
refused unless `--force`, and with `--force` the files servesim did not write
are kept in the new directory. `--out .` in a project folder is refused, not wiped.

The run is written into a fresh hidden directory next to the target
(`.servesim-stage-<name>-XXXXXXXX`), and only a finished run is swapped into
place, in one step where the system can (Linux's renameat2 RENAME_EXCHANGE),
else by two renames under the lock: the target holds one run, the old one until
the swap and the new one after it. A crash, an error or Ctrl-C removes the
hidden directory and the lock file and leaves the old result as it was; a
`kill -9` can leave a hidden directory (never a half-written target), which the
next run into the same target removes. Ctrl-C waits while
the hidden directory is made and its clean-up registered, and while the swap
and the old run's removal run, so none of them can be cut in half; a Staging
dropped without a commit (an interrupt before its `with` block) removes its
directory and lets go of the lock when the object goes, or at exit.

Every command that writes a result directory goes through Staging, the calibrate
commands included (`calibrate fit` in `adds` mode: it adds fit.json to a table). The
checks themselves live in sim.results.files.dir_checks.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import sys
import weakref
from pathlib import Path
from types import TracebackType

from sim.results.files.dir_checks import (
    OutputDirError,
    check_contents,
    check_output_dir,
    short_name,
    variant_dir,
)
from sim.results.files.dir_lock import DirBusy, DirLock
from sim.results.files.held_signals import signals_held
from sim.results.files.manifest import entries, keep_others, read_manifest, write_manifest
from sim.results.files.swap import exchange

__all__ = ["OutputDirError", "Staging", "check_output_dir", "signals_held", "variant_dir"]

STAGE_PREFIX = ".servesim-"


def _tag(target: Path) -> str:
    name = target.name
    return name if len(os.fsencode(name)) <= 150 else hashlib.sha256(
        os.fsencode(name)).hexdigest()[:32]


class Staging:
    """A hidden directory beside `target` to write a run into; `commit` swaps it in.

    Holds the target's lock from creation to commit or abort. `command` names what writes
    (the manifest records it; a result of another command is not replaced without
    `force`). Use as a context manager: leaving the block without `commit` (an error, a
    return, Ctrl-C) removes the hidden directory, the lock file and any parent it created.

    `adds`: the command adds its named files to whatever the directory holds (`calibrate
    fit` writes fit.json beside a table's measurements) instead of replacing a result. Then
    nothing is refused and nothing of the old directory is deleted: every old file the new
    files do not replace by name is kept, and the manifest keeps the directory's command
    and lists the old manifest's files plus the new ones.
    """

    def __init__(self, target: Path, field: str, command: str = "run",
                 force: bool = False, adds: bool = False) -> None:
        check_output_dir(target, field)
        self.target = Path(os.path.realpath(target))  # a symlinked results/ keeps its link
        self.field, self.command, self.force, self.adds = field, command, force, adds
        self.kept: list[str] = []
        self.committed = False
        self._created: list[Path] = []
        self._lock: DirLock | None = None
        self.shown = shown = f"{field} {str(target)!r}"  # as the user gave it
        try:
            self._lock_target()
            self._clear_leftovers()
            check_contents(self.target, shown, command, force or adds)
            path = self._fresh("stage")
            with signals_held():
                os.mkdir(path)
                self.path = path
                self._cleanup = weakref.finalize(self, shutil.rmtree, path, True)
        except DirBusy as busy:
            self.abort()
            raise OutputDirError(_busy(shown, busy)) from None
        except OutputDirError:
            self.abort()
            raise
        except OSError as err:
            self.abort()
            raise OutputDirError(f"{shown}: cannot create it: {err.strerror or err}") from None
        except BaseException:  # Ctrl-C, delivered as the signals are let through again
            self.abort()
            raise

    def _lock_target(self) -> None:
        with signals_held():
            self._lock = _lock_with_parents(self.target, self._created)
            self._unlock = weakref.finalize(self, self._lock.release)

    def _fresh(self, kind: str) -> Path:
        """`.servesim-<kind>-<target name>-<8 hex>` beside the target (the name hashed when
        long), so a later run into the same target can tell its leftovers."""
        return self.target.parent / f"{STAGE_PREFIX}{kind}-{_tag(self.target)}-" \
                                    f"{secrets.token_hex(4)}"

    def _clear_leftovers(self) -> None:
        """Remove what a killed run into this target left (we hold the lock, so no live run
        owns any): its hidden directory, or, if it died between the two renames of a swap,
        put the old run it had moved aside back in place."""
        mine = re.compile(rf"{re.escape(STAGE_PREFIX)}(stage|old)-{re.escape(_tag(self.target))}"
                          r"-[0-9a-f]{8}")
        with os.scandir(self.target.parent) as listing:
            found = sorted((e.name, e.path) for e in listing if mine.fullmatch(e.name))
        for name, path in found:
            if name.startswith(f"{STAGE_PREFIX}old-") and not os.path.lexists(self.target):
                os.rename(path, self.target)
            else:
                shutil.rmtree(path, ignore_errors=True)

    def commit(self) -> Path:
        """Put the written run in place of the target, keeping the files servesim did not
        write there; servesim's files of the old run are deleted (in `adds` mode every old
        file the new ones do not replace is kept)."""
        try:
            self._list_and_keep()
        except OSError as err:
            raise OutputDirError(f"{self.shown}: cannot finish the new "
                                 f"result ({short_name(str(err.filename))}: {err.strerror or err});"
                                 " the old result is untouched") from None
        with signals_held():
            try:
                old = self._swap()
            except OSError as err:
                raise OutputDirError(f"{self.shown}: cannot put the new result in place: "
                                     f"{err.strerror or err}; the old result is untouched"
                                     ) from None
            self.committed = True
            self._cleanup.detach()
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            self._release()
        if self.kept:
            more = f" and {len(self.kept) - 1} more" if len(self.kept) > 1 else ""
            print(f"note: {self.shown}: kept {short_name(self.kept[0])!r}"
                  f"{more}, which servesim did not write", file=sys.stderr)
        return self.target

    def _list_and_keep(self) -> None:
        """Write the manifest and bring in the old directory's files to keep."""
        old_dir = os.path.isdir(self.target) and not os.path.islink(self.target)
        old = read_manifest(self.target) if old_dir else None
        if not self.adds:
            write_manifest(self.path, self.command)
            if old_dir:
                self.kept = keep_others(self.target, self.path, old)
            return
        written = {rel for rel, is_dir in entries(self.path) if not is_dir}
        if old_dir:
            keep_others(self.target, self.path, None)  # all of it: nothing is replaced whole
        write_manifest(self.path, old.command if old else self.command,
                       written | (old.files if old else frozenset()))

    def _swap(self) -> Path | None:
        """The written run in at the target; returns where the old run now lies (or None)."""
        if not os.path.lexists(self.target):
            os.rename(self.path, self.target)
            return None
        if exchange(self.path, self.target):
            return self.path
        aside = self._fresh("old")
        os.rename(self.target, aside)
        try:
            os.rename(self.path, self.target)
        except OSError:
            os.rename(aside, self.target)
            raise
        return aside

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._unlock.detach()
            self._lock = None

    def abort(self) -> None:
        """Remove what was written, the lock and the parents made for it; the target is
        untouched."""
        if hasattr(self, "path"):
            shutil.rmtree(self.path, ignore_errors=True)
            if hasattr(self, "_cleanup"):
                self._cleanup.detach()
        self._release()
        _remove_parents(self._created)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if not self.committed:
            self.abort()


def _lock_with_parents(target: Path, created: list[Path]) -> DirLock:
    """Make the missing parents (noted in `created`) and take the lock; a parent another run
    removes as it gives up between the two is made again."""
    for attempt in range(3):
        for parent in reversed([p for p in [target.parent, *target.parent.parents]
                                if not p.exists()]):
            try:
                parent.mkdir()
                created.append(parent)
            except FileExistsError:
                pass  # another run made it a moment ago
        try:
            return DirLock(target)
        except FileNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _remove_parents(created: list[Path]) -> None:
    for parent in reversed(created):
        try:
            parent.rmdir()
        except OSError:
            break
    created.clear()


def _busy(shown: str, busy: DirBusy) -> str:
    return (f"{shown}: in use by another servesim run ({busy}); wait for it to finish, or "
            "choose another directory")
