"""The scenario's `disaggregation` section: a prefill pool, a decode pool and the link between.

A disaggregated fleet (DistServe, Splitwise, Mooncake; vLLM's KV connectors) prefills a
request on one instance and decodes it on another, moving the prompt's KV over a link.
Each pool has its own replicas and, when given, its own GPUs (`hardware`), scheduler and
KV settings; an omitted section is the scenario's own. The link is one `Link`
(sim.config.link): a name (rdma-400, nvlink4, pcie5, ...) or a mapping of Link fields,
`bandwidth_bytes_per_s: null` for a free link. sim.world.disaggregated runs it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from sim.config.catalogue import link_from_fields
from sim.config.link import Link
from sim.config.sections import HardwareConfig, KVConfig, SchedulerConfig, StrictModel

MAX_POOL_REPLICAS = 1024


class PoolConfig(StrictModel):
    """One side of a disaggregated fleet: its replicas and, optionally, its own settings."""

    replicas: int = Field(1, ge=1, le=MAX_POOL_REPLICAS, description="instances in the pool, "
                          "each of its hardware.count GPUs")
    hardware: HardwareConfig | None = Field(None, description="the pool's GPUs (default: the "
                                            "scenario's hardware)")
    scheduler: SchedulerConfig | None = Field(None, description="the pool's scheduler "
                                              "(default: the scenario's scheduler)")
    kv: KVConfig | None = Field(None, description="the pool's KV settings (default: the "
                                "scenario's kv)")


class DisaggregationConfig(StrictModel):
    """Prefill/decode disaggregation: two pools and the link the prompt's KV crosses."""

    prefill: PoolConfig = Field(PoolConfig(), description="the pool that prefills and emits "
                                "the first token")
    decode: PoolConfig = Field(PoolConfig(), description="the pool that decodes the rest")
    link: str | dict[str, Any] = Field(
        "rdma-400", description="prefill -> decode link: a link name (rdma-400, nvlink4, "
        "pcie5, ...) or a mapping of Link fields, e.g. {kind: rdma, line_rate_gbit_per_s: "
        "200, bandwidth_bytes_per_s: 2.2e10, latency_s: 1.0e-5}; bandwidth_bytes_per_s: "
        "null is a free link")
    layerwise: bool = Field(
        False, description="the KV leaves layer by layer during the prefill's last step "
        "(that step's time overlaps the transfer; the last layer's bytes always remain)")
    prefill_router: Literal["round_robin", "least_outstanding", "least_kv", "power_of_two",
                            "prefix_aware"] | None = Field(
        None, description="picks the prefill instance (default: router.policy)")
    decode_router: Literal["least_kv", "least_outstanding"] = Field(
        "least_kv", description="picks the decode instance: most free KV, or fewest "
        "requests in flight")

    @field_validator("link")
    @classmethod
    def _known_link(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        link_from_fields(value)
        return value

    @property
    def link_value(self) -> Link:
        return link_from_fields(self.link)

    def num_gpus(self, default_count: int) -> int:
        """GPUs of both pools (a pool without hardware has the scenario's `default_count`)."""
        return sum(pool.replicas * (default_count if pool.hardware is None
                                    else pool.hardware.count)
                   for pool in (self.prefill, self.decode))
