"""Two directories swapped in one step, so a result directory is never absent.

Why: committing a run by two renames (old aside, new in) leaves an instant with no
directory at the target, and a `kill -9` between them leaves the old run under a hidden
name. Linux's renameat2 with RENAME_EXCHANGE swaps the two names atomically; Python's os
module does not offer it, so it is called through ctypes. Elsewhere (or on a file system
that refuses it) the caller falls back to two renames under its lock.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux's renameat2 with RENAME_EXCHANGE), so the target
    is never absent; False where the system or the file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a libc older than glibc 2.28
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint)
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))
