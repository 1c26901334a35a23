"""Link: one mover of bytes (GPU to GPU, GPU to host, node to node) and what moving over it costs.

Why one value: every transfer the simulator prices reads a `Link` and one of the pure
functions below. Today those are tensor parallelism's all-reduce, expert parallelism's
all-to-all and swap preemption's host copies; prefill-to-decode KV transfers, KV offload
tiers and the MoE all-to-all across nodes will read the same value. A link's figures then
live in one place (sim/config/data/links.json, each with its source), and a scenario
overrides them one way (`hardware.link`, or a GPU mapping's `link` / `host_link`).

A link is two published figures, as nccl-tests reports them:
- `bandwidth_bytes_per_s`: what one GPU moves in one direction, as achieved, i.e.
  nccl-tests' bus bandwidth (busbw) at large messages. busbw is defined so that it
  compares with the hardware's per-direction rate whatever the number of ranks.
- `latency_s`: the fixed cost of one operation, measured as a small-message all-reduce
  (the time nccl-tests, or vLLM's custom all-reduce, reports at a few bytes).

An operation over n ranks then costs `latency_s + bus bytes / bandwidth`, with nccl-tests'
bus factors (doc/PERFORMANCE.md in NVIDIA/nccl-tests): all-reduce moves 2(n-1)/n of the
buffer per rank, all-to-all (n-1)/n, a one-way copy all of it. The latency is flat in n:
the small-message all-reduce that decode steps issue is one-shot (vLLM's custom all-reduce
measures 9.5, 9.1 and 10.1 us on 2, 4 and 8 H100s), not a ring of 2(n-1) steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# nvlink: NVLink/NVSwitch; pcie: PCI Express (generation required); infinity-fabric: AMD's
# xGMI GPU mesh; rdma: InfiniBand/RoCE at a stated line rate; tcp: sockets.
LINK_KINDS = ("nvlink", "pcie", "infinity-fabric", "rdma", "tcp")
_GENERATIONS = {"nvlink": range(0, 6), "pcie": range(1, 8), "infinity-fabric": range(0, 6)}
_LINE_RATE_KINDS = ("rdma", "tcp")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Link:
    """A mover of bytes: its kind, per-direction bandwidth (None: free) and fixed latency.

    `generation`: NVLink 1-5 (0: a chip-to-chip NVLink-C2C, no generation), PCIe 1-7
    (required), Infinity Fabric 0-5 (0: unstated); none for rdma/tcp.
    `line_rate_gbit_per_s`: rdma (required) and tcp (optional) NICs' stated rate, e.g. 400;
    the bandwidth may not exceed it.
    """

    kind: str
    bandwidth_bytes_per_s: float | None
    latency_s: float
    generation: int = 0
    line_rate_gbit_per_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise ValueError(f"link kind must be one of {', '.join(LINK_KINDS)}, "
                             f"got {self.kind!r}")
        bw = self.bandwidth_bytes_per_s
        if bw is not None and not (_is_number(bw) and 0 < bw < math.inf):
            raise ValueError(f"link bandwidth_bytes_per_s must be a finite number > 0, or "
                             f"None for a free link, got {bw!r}")
        if not (_is_number(self.latency_s) and 0 <= self.latency_s < math.inf):
            raise ValueError(f"link latency_s must be a finite number >= 0, "
                             f"got {self.latency_s!r}")
        allowed = _GENERATIONS.get(self.kind, range(0, 1))
        if not (isinstance(self.generation, int) and not isinstance(self.generation, bool)
                and self.generation in allowed):
            span = (f"{allowed.start}-{allowed.stop - 1}" if len(allowed) > 1
                    else "0 (none)")
            raise ValueError(f"link generation of a {self.kind} link must be a whole number "
                             f"{span}, got {self.generation!r}")
        rate = self.line_rate_gbit_per_s
        if not (_is_number(rate) and 0 <= rate < math.inf):
            raise ValueError(f"link line_rate_gbit_per_s must be a finite number >= 0, "
                             f"got {rate!r}")
        if self.kind == "rdma" and rate == 0:
            raise ValueError("link line_rate_gbit_per_s is required for an rdma link "
                             "(the NIC's stated Gb/s, e.g. 400), got 0")
        if rate and self.kind not in _LINE_RATE_KINDS:
            raise ValueError(f"link line_rate_gbit_per_s is for rdma and tcp links only, "
                             f"got {rate!r} on a {self.kind} link")
        if rate and bw is not None and bw * 8 / 1e9 > rate:
            raise ValueError(f"link bandwidth_bytes_per_s={bw!r} is more than its line rate "
                             f"of {rate!r} Gb/s ({rate * 1e9 / 8:.4g} bytes/s)")

    @property
    def free(self) -> bool:
        """True when the link moves bytes in no time (only its latency is paid)."""
        return self.bandwidth_bytes_per_s is None


def _check_bytes(nbytes: float) -> None:
    if not (_is_number(nbytes) and 0 <= nbytes < math.inf):
        raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")


def _check_ranks(ranks: int) -> None:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be a whole number >= 1, got {ranks!r}")


def _over(link: Link, bus_bytes: float) -> float:
    """The link's latency plus `bus_bytes` at its bandwidth (a free link: latency only)."""
    bw = link.bandwidth_bytes_per_s
    return link.latency_s + (bus_bytes / bw if bw is not None else 0.0)


def transfer_s(link: Link, nbytes: float) -> float:
    """Seconds to copy `nbytes` one way over `link`: latency + bytes / bandwidth.

    Nothing to move issues no copy and costs 0."""
    _check_bytes(nbytes)
    return _over(link, nbytes) if nbytes else 0.0


def allreduce_bus_bytes(nbytes: float, ranks: int) -> float:
    """Bytes one rank sends (and receives) to all-reduce an `nbytes` buffer over `ranks`:
    2(n-1)/n of it, nccl-tests' all-reduce bus factor (busbw = algbw * 2(n-1)/n)."""
    _check_bytes(nbytes)
    _check_ranks(ranks)
    return 2 * (ranks - 1) / ranks * nbytes


def allreduce_s(link: Link, nbytes: float, ranks: int) -> float:
    """Seconds to all-reduce an `nbytes` buffer across `ranks` GPUs over `link`.

    latency + 2(n-1)/n * nbytes / busbw: the time nccl-tests would report for that size
    given the link's busbw and small-message time. One rank, or an empty buffer, costs 0."""
    if ranks == 1 or not nbytes:
        _check_bytes(nbytes)
        _check_ranks(ranks)
        return 0.0
    return _over(link, allreduce_bus_bytes(nbytes, ranks))


def all_to_all_s(link: Link, nbytes: float, ranks: int) -> float:
    """Seconds for an all-to-all in which each of `ranks` GPUs holds an `nbytes` buffer and
    sends each other rank its 1/n share: latency + (n-1)/n * nbytes / busbw (nccl-tests'
    alltoall bus factor). One rank, or an empty buffer, costs 0."""
    _check_bytes(nbytes)
    _check_ranks(ranks)
    if ranks == 1 or not nbytes:
        return 0.0
    return _over(link, (ranks - 1) / ranks * nbytes)
