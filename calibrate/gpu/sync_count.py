"""Counting the host's waits on the device inside a block of engine work.

On CUDA, torch's own sync debug mode warns at every operation that makes the
host wait (a `.item()`, `.tolist()`, a blocking copy, a synchronize...): the
warnings are counted. A CPU never waits, so there the operations that would
wait on a GPU are counted by patching them: `.item()`, `.tolist()`,
`int()`/`float()`/`bool()` of a tensor, a tensor used as an index, `.cpu()`
and every CUDA synchronize. A step of the engine must count exactly one: the
transfer of its sampled tokens.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Iterator

import torch

_TENSOR_READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "cpu")


@contextlib.contextmanager
def patched_reads() -> Iterator[Counter]:
    """Count each host read of a tensor and each CUDA wait by name (any device)."""
    counts: Counter = Counter()
    originals = [(torch.Tensor, name, getattr(torch.Tensor, name)) for name in _TENSOR_READS]
    originals += [(owner, "synchronize", owner.synchronize)
                  for owner in (torch.cuda, torch.cuda.Stream, torch.cuda.Event)]

    def wrap(name: str, fn):  # noqa: ANN001, ANN202
        def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            counts[name] += 1
            return fn(*args, **kwargs)
        return counted

    try:
        for owner, name, fn in originals:
            setattr(owner, name, wrap(name, fn))
        yield counts
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


@contextlib.contextmanager
def cuda_sync_warnings() -> Iterator[Counter]:
    """Count torch's synchronizing-operation warnings (CUDA's sync debug mode)."""
    counts: Counter = Counter()
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode(before)
    for w in caught:
        if "synchroniz" in str(w.message):
            counts["cuda sync"] += 1


def count_syncs(device: torch.device) -> contextlib.AbstractContextManager[Counter]:
    """The device's counter: CUDA's own sync warnings, else the patched reads."""
    return cuda_sync_warnings() if device.type == "cuda" else patched_reads()
