"""Result directories: checked before the work, written beside the target, swapped in whole.

A command checks its output directory before it simulates anything (a file in
the way, no write permission, a name the file system refuses), so a mistake
costs no work. The run is then written into a fresh hidden directory next to
the target (`.servesim-XXXXXXXX`), and only a finished run is renamed into
place: the target holds exactly one run, the old one until the swap and the new
one after it (no `timeline.csv` of an earlier run left beside new requests). A
crash, an error or Ctrl-C removes the hidden directory and leaves the old
result as it was; a `kill -9` can leave the hidden directory, never a half-
written target. The swap is two renames (old aside, new in); between them the
target is absent for an instant and the old run sits under `.servesim-old-*`.
Ctrl-C waits while the hidden directory is made and its clean-up registered,
and while the two renames run, so neither can be cut in half; a hidden
directory whose Staging is dropped without a commit (an interrupt before its
`with` block) is removed when the object goes, or at exit.

Replacing deletes the old directory, so only an empty directory or one holding
a servesim result (`summary.json`, `compare.csv`, `sweep.csv` or `plan.csv`) is replaced;
`--out .` in a project folder is refused, not wiped.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import signal
import threading
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

RESULT_MARKERS = ("summary.json", "compare.csv", "sweep.csv", "plan.csv")
STAGE_PREFIX = ".servesim-"


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends (main thread; elsewhere nothing).

    The handlers are swapped for one that only notes the signal, and a noted signal is
    raised again once the old handlers are back. Blocking the signals with
    `pthread_sigmask` would not do: it masks the main thread only, so with any other
    thread alive (a progress bar's monitor, a pool's manager) the kernel hands the
    signal to that thread and Python raises KeyboardInterrupt in the main thread
    inside the block anyway.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    kinds = (signal.SIGINT, signal.SIGTERM)
    old = {kind: signal.getsignal(kind) for kind in kinds}
    for kind in kinds:
        if old[kind] is not None:  # None: a handler not set from Python; leave it be
            signal.signal(kind, lambda signum, _frame: noted.append(signum))
    try:
        yield
    finally:
        for kind in kinds:
            if old[kind] is not None:
                signal.signal(kind, old[kind])
        for signum in noted:
            signal.raise_signal(signum)


class OutputDirError(Exception):
    """The output directory cannot take the results: a user mistake, exit code 2."""


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


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_output_dir(path: Path, field: str, replace: bool = False) -> None:
    """Raise OutputDirError unless `path` can become a directory of results; creates nothing.

    `field` names the setting the path came from (`--out`, `output.dir`, ...).
    `replace`: the directory will be replaced whole, so it must hold a result or nothing.
    """
    shown = f"{field} {str(path)!r}"
    target = Path(os.path.abspath(path))
    if len(os.fsencode(str(target))) >= 4096:
        raise OutputDirError(f"{shown}: the path is longer than the 4096 bytes a path may have")
    existing = target
    while not os.path.lexists(existing):
        existing = existing.parent
    limit = _name_max(existing if existing.is_dir() else existing.parent)
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
        if replace and not is_replaceable(target):
            raise OutputDirError(f"{shown}: holds files that are not a servesim result (no "
                                 f"{', '.join(RESULT_MARKERS)}); give a new or empty directory")
        existing = target.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"{shown}: {str(existing)!r} is not writable")


def is_replaceable(directory: Path) -> bool:
    """Empty, or holding a servesim result that a new run may replace."""
    names = set(os.listdir(directory))
    return not names or any(marker in names for marker in RESULT_MARKERS)


class Staging:
    """A hidden directory beside `target` to write a run into; `commit` swaps it in.

    Use as a context manager: leaving the block without `commit` (an error, a
    return, Ctrl-C) removes the hidden directory and any parent it created.
    """

    def __init__(self, target: Path, field: str) -> None:
        check_output_dir(target, field, replace=True)
        self.target = Path(os.path.realpath(target))  # a symlinked results/ keeps its link
        self.field = field
        self._created: list[Path] = []
        try:
            missing = [p for p in [self.target.parent, *self.target.parent.parents]
                       if not p.exists()]
            for parent in reversed(missing):
                parent.mkdir()
                self._created.append(parent)
            path = self._fresh(STAGE_PREFIX)
            with signals_held():
                os.mkdir(path)
                self.path = path
                self._cleanup = weakref.finalize(self, shutil.rmtree, path, True)
        except OSError as err:
            self.abort()
            raise OutputDirError(f"{field} {str(target)!r}: cannot create it: "
                                 f"{err.strerror or err}") from None
        except BaseException:  # Ctrl-C, delivered as the signals are let through again
            self.abort()
            raise
        self.committed = False

    def _fresh(self, prefix: str) -> Path:
        return self.target.parent / f"{prefix}{secrets.token_hex(4)}"

    def commit(self) -> Path:
        """Put the written run in place of the target (the old run, if any, is deleted)."""
        aside = None
        with signals_held():
            if os.path.lexists(self.target):
                aside = self._fresh(STAGE_PREFIX + "old-")
                os.rename(self.target, aside)
            os.rename(self.path, self.target)
            self.committed = True
            self._cleanup.detach()
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return self.target

    def abort(self) -> None:
        """Remove what was written and the parents made for it; the target is untouched."""
        if hasattr(self, "path"):
            shutil.rmtree(self.path, ignore_errors=True)
            if hasattr(self, "_cleanup"):
                self._cleanup.detach()
        for parent in reversed(self._created):
            try:
                parent.rmdir()
            except OSError:
                break
        self._created = []

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if not self.committed:
            self.abort()
