"""A step's small host arrays on the device in one copy that never makes the host wait.

Every per-step tensor the kernels read (token ids, positions, slots, offsets,
sampling parameters...) is packed into one byte buffer, 8-byte aligned per
field, and copied to the device once. On CUDA the host side is pinned memory
from torch's caching host allocator and the copy is `non_blocking`: the host
enqueues it and moves on (a copy from pageable memory, or `torch.tensor(...,
device="cuda")`, waits for the device first). The caching allocator records
the copy's stream, so a pinned block is reused only once its copy is done:
nothing here has to be released by hand. On the CPU the packed buffer *is*
the tensor storage: no copy at all.

The fields come back as typed views into the one device buffer (`Staged.packed`),
which is what lets a CUDA graph's static inputs be refreshed with a single
device-to-device copy of a prefix of that buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

_ALIGN_BYTES = 8
_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float64: np.float64,
          torch.float32: np.float32}


@dataclass(frozen=True, slots=True)
class Staged:
    """The device buffer and each field's typed view into it, in the order asked for."""

    packed: torch.Tensor  # (nbytes,) uint8 on the device
    views: tuple[torch.Tensor, ...]
    offsets: tuple[int, ...]  # byte offset of each field in `packed`


def _layout(sizes: Sequence[tuple[int, torch.dtype]]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for count, dtype in sizes:
        offsets.append(end)
        nbytes = count * dtype.itemsize
        end += -(-nbytes // _ALIGN_BYTES) * _ALIGN_BYTES
    return offsets, max(end, _ALIGN_BYTES)


def stage(fields: Sequence[tuple[Sequence[int] | Sequence[float] | np.ndarray, torch.dtype]],
          device: torch.device) -> Staged:
    """Pack `fields` (values, dtype) and put them on `device`: one copy, no host wait."""
    arrays = [np.asarray(values, dtype=_NUMPY[dtype]) for values, dtype in fields]
    offsets, nbytes = _layout([(a.size, dtype) for a, (_, dtype) in zip(arrays, fields,
                                                                         strict=True)])
    pin = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    raw = host.numpy()
    for array, offset in zip(arrays, offsets, strict=True):
        raw[offset:offset + array.nbytes] = array.view(np.uint8).reshape(-1)
    packed = host.to(device, non_blocking=True) if device.type != "cpu" else host
    views = []
    for array, offset, (_, dtype) in zip(arrays, offsets, fields, strict=True):
        views.append(packed[offset:offset + array.nbytes].view(dtype))
    return Staged(packed, tuple(views), tuple(offsets))
