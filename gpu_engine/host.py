"""How the engine runs on a host the same way whenever it is timed: serving, profiling, validating.

- `torch_threads`: the engine's intra-op threads for a block (1 is steady on a shared
  machine; more threads on a busy 2-core box wait on each other).
- `frozen_gc`: Python's collector kept off objects that live through the block, so a
  full collection (hundreds of ms over every imported module's objects) never lands
  inside a measured step, in a profile or in a replay.
- `steady_malloc`: glibc keeps freed memory instead of mapping every large block
  anew; otherwise a step's big activations are page-faulted in each time, at a cost
  that depends on what ran before (a 512-token prefill of `tiny` took 44 ms, 21 ms
  with it), so a profile and a replay would disagree.
- `ThreadCpuClock`: engine time from the thread's CPU time, for a machine so busy
  that wall times mean little.
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from types import MappingProxyType

import torch


class ThreadCpuClock:
    """Engine time that only this thread's CPU time advances, plus the idle waits it skips.

    A single-threaded CPU engine's CPU time is what its steps take on a core of
    their own, so a profile and a replay timed by it agree on a shared machine
    whose other jobs would stretch wall times unpredictably. Waiting for an
    arrival jumps the clock instead of sleeping.
    """

    def __init__(self) -> None:
        self._origin = time.thread_time()
        self._idle_s = 0.0

    def now(self) -> float:
        return time.thread_time() - self._origin + self._idle_s

    def wait_until(self, t_s: float) -> None:
        self._idle_s += max(0.0, t_s - self.now())


TIMERS: Mapping[str, Callable[[], float]] = MappingProxyType(
    {"wall": time.perf_counter, "cpu": time.thread_time})


@contextmanager
def frozen_gc():  # noqa: ANN201 - a context manager
    """Move every object alive now out of the collector's reach for the block (as serving
    engines do after start-up): full collections then scan only what the block creates,
    instead of pausing a step for a traversal of every imported module's objects."""
    nested = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not nested:  # an enclosing block unfreezes everything when it ends
            gc.unfreeze()


@contextmanager
def torch_threads(threads: int | None):  # noqa: ANN201 - a context manager
    """Run with `threads` intra-op threads (None: leave torch's setting), then restore."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def steady_malloc() -> bool:
    """Process-wide, glibc only: blocks up to 32 MiB come from the heap, which is never
    trimmed below 1 GiB of free space. Returns whether it applied (False elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
                    and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False
