"""HardwareSpec: one accelerator's rates and sizes, the GPU half of every cost formula.

Apart from the model spec (sim.config.specs) because the two vary independently: the
catalogue (sim.config.catalogue) pairs any model with any GPU, and a GPU's numbers need
none of a model's arithmetic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.config.checks import check_positive


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator; bandwidths are per direction, FLOPs are dense (no sparsity).

    `fp8_flops_per_s`, `int8_flops_per_s` and `fp4_flops_per_s` are the tensor-core rates
    of those formats; 0 means the GPU has none and such matmuls run at the bf16 rate.
    """

    name: str
    bf16_flops_per_s: float
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    interconnect_bandwidth_bytes_per_s: float  # GPU-to-GPU, per GPU, one direction
    host_link_bandwidth_bytes_per_s: float  # PCIe to host, one direction
    fp8_flops_per_s: float = 0.0
    int8_flops_per_s: float = 0.0
    fp4_flops_per_s: float = 0.0
    sm_count: int = 0  # streaming multiprocessors (AMD: compute units); 0 = unknown

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        if isinstance(self.sm_count, bool) or not isinstance(self.sm_count, int) \
                or self.sm_count < 0:
            raise ValueError(f"sm_count must be a whole number >= 0 (0 = unknown), got "
                             f"{self.sm_count!r}")
        for f in dataclasses.fields(self)[1:6]:
            check_positive(f.name, getattr(self, f.name))
        for f in dataclasses.fields(self)[6:]:
            value = getattr(self, f.name)
            if value != 0:
                check_positive(f.name, value)

    def flops_per_s(self, compute: str) -> float:
        """Dense FLOP/s of matmuls in `compute` (a dtype's kind); bf16's where there is none."""
        rate = getattr(self, f"{compute}_flops_per_s", 0.0) if compute != "bf16" else 0.0
        return rate or self.bf16_flops_per_s

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound."""
        return self.bf16_flops_per_s / self.memory_bandwidth_bytes_per_s
