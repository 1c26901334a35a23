"""Device, dtype and memory of the machine the engine runs on (no scenario, no simulator).

Kept apart from gpu_engine/setup.py so that what runs on a bare GPU machine
(calibration, calibrate/gpu/check.py) imports neither pydantic nor simpy.
"""

from __future__ import annotations

import os

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineSetupError(ValueError):
    """The scenario cannot run on this engine or machine (a user error, not a bug)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise EngineSetupError("engine.device: 'cuda' asked for, but torch sees no CUDA device "
                               f"(torch {torch.__version__}); use 'cpu' or 'auto'")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def available_memory_bytes() -> int:
    """Host memory the engine may still take (MemAvailable where the OS tells it)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
