"""One run per result directory: an OS lock beside the directory, named holder inside it.

Why a lock file beside the target, taken with `fcntl.flock`:
- flock belongs to the open file, so the kernel drops it when the process ends in any way
  (a crash, `kill -9`, a closed laptop lid on a network mount aside): no stale lock ever
  needs a human to delete it, unlike a lock that is merely a file's existence (O_EXCL).
- flock locks of two opens conflict even inside one process, so in-process tests see what
  two processes see; fcntl's POSIX record locks (lockf) would not, and are dropped when
  the process closes *any* descriptor of the file.
- Beside, not inside: a commit swaps the target directory for a new one, so a lock file
  inside it would move away with the old run and the next run would lock a new file.

The holder writes its pid, command line and start time into the file, so a refused run can
say who holds the directory. The holder deletes the file as it lets go; a run that locked
the file just before it was deleted finds the path gone (or another file there) and tries
again, so two runs never both believe they hold the directory. A `kill -9` leaves the file
behind with no lock on it: the next run takes it over.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_PREFIX = ".servesim-lock-"
SHOWN_COMMAND_CHARS = 60  # a refused run echoes the holder's command to this length


class DirBusy(Exception):
    """Another run holds the directory; the message names it (pid, command, start)."""


def lock_path(target: Path, name_max: int = 255) -> Path:
    """The lock file of `target`: `.servesim-lock-<name>` beside it (a hash if too long)."""
    name = LOCK_PREFIX + target.name
    if len(os.fsencode(name)) > name_max:
        name = LOCK_PREFIX + hashlib.sha256(os.fsencode(target.name)).hexdigest()[:32]
    return target.parent / name


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a directory, as the lock file records it."""

    pid: int
    command: str
    started_utc: str

    def describe(self) -> str:
        command = self.command
        if len(command) > SHOWN_COMMAND_CHARS:
            command = command[:SHOWN_COMMAND_CHARS - 3] + "..."
        return f"pid {self.pid}, `{command}`, started {self.started_utc}"


def this_run() -> Holder:
    argv = ["servesim", *sys.argv[1:]] if sys.argv and sys.argv[0] else ["servesim"]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return Holder(os.getpid(), shlex.join(argv), started)


class DirLock:
    """An exclusive, non-blocking lock on one result directory; `release` deletes the file."""

    def __init__(self, target: Path) -> None:
        self.path = lock_path(target, name_max(target.parent))
        self._fd: int | None = None
        for _ in range(100):  # each retry means a holder let go in between: rare
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DirBusy(_held_by(self.path)) from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                self._fd = fd
                break
            os.close(fd)  # the file we locked was deleted by its last holder: again
        else:
            raise DirBusy("another servesim run (the lock changed hands 100 times)")
        holder = this_run()
        os.ftruncate(self._fd, 0)
        os.write(self._fd, json.dumps({"pid": holder.pid, "command": holder.command,
                                       "started_utc": holder.started_utc}).encode())

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Delete the lock file, then let go of it (in that order: see the module's notes)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            if _same_file(fd, self.path):
                os.unlink(self.path)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _held_by(path: Path) -> str:
    """The holder's description; a holder that has not written it yet gets a moment."""
    for _ in range(20):
        try:
            data = json.loads(path.read_text())
            return Holder(int(data["pid"]), str(data["command"]),
                          str(data["started_utc"])).describe()
        except FileNotFoundError:
            break
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.01)  # created and locked, its holder still writing
    return "another servesim run"


def name_max(directory: Path) -> int:
    """The longest file name the directory's file system allows (255 if it will not say)."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255
