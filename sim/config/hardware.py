"""HardwareSpec: one accelerator's rates and sizes, the GPU half of every cost formula.

Apart from the model spec (sim.config.specs) because the two vary independently: the
catalogue (sim.config.catalogue) pairs any model with any GPU, and a GPU's numbers need
none of a model's arithmetic. Its two movers of bytes are `Link` values
(sim.config.link): the GPU-to-GPU link tensor and expert parallelism cross, and the host
link swaps cross.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.config.checks import check_positive
from sim.config.link import Link


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator; bandwidths are per direction, FLOPs are dense (no sparsity).

    `fp8_flops_per_s`, `int8_flops_per_s` and `fp4_flops_per_s` are the tensor-core rates
    of those formats; 0 means the GPU has none and such matmuls run at the bf16 rate.
    `link`: the GPU-to-GPU link within a node (NVLink, or PCIe on cards without it);
    `host_link`: the link to host memory. Their bandwidths are also read as
    `interconnect_bandwidth_bytes_per_s` and `host_link_bandwidth_bytes_per_s`, the names
    a scenario's GPU mapping has always used.
    """

    name: str
    bf16_flops_per_s: float
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    link: Link  # GPU-to-GPU within a node
    host_link: Link  # GPU to host memory
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
        for name in ("bf16_flops_per_s", "memory_bytes", "memory_bandwidth_bytes_per_s"):
            check_positive(name, getattr(self, name))
        for name in ("link", "host_link"):
            if not isinstance(getattr(self, name), Link):
                raise ValueError(f"{name} must be a Link (sim.config.link), got "
                                 f"{getattr(self, name)!r}")
        for name in ("fp8_flops_per_s", "int8_flops_per_s", "fp4_flops_per_s"):
            value = getattr(self, name)
            if value != 0:
                check_positive(name, value)

    @property
    def interconnect_bandwidth_bytes_per_s(self) -> float:
        """GPU-to-GPU bytes/s per GPU, one direction: the link's (inf for a free link)."""
        bw = self.link.bandwidth_bytes_per_s
        return math.inf if bw is None else bw

    @property
    def host_link_bandwidth_bytes_per_s(self) -> float:
        """GPU-to-host bytes/s, one direction: the host link's (inf for a free link)."""
        bw = self.host_link.bandwidth_bytes_per_s
        return math.inf if bw is None else bw

    def flops_per_s(self, compute: str) -> float:
        """Dense FLOP/s of matmuls in `compute` (a dtype's kind); bf16's where there is none."""
        rate = getattr(self, f"{compute}_flops_per_s", 0.0) if compute != "bf16" else 0.0
        return rate or self.bf16_flops_per_s

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound."""
        return self.bf16_flops_per_s / self.memory_bandwidth_bytes_per_s
