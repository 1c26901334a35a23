"""summary.json's `kv_offload`: what the prefix cache's offload tiers held, gave back and cost.

Per run, summed over replicas, per tier (host, then disk when configured): blocks written
down into the tier (the GPU's evictions into host, the host's LRU drops into disk) and
loaded back to the GPU, with their bytes (all GPU shards); the share of admissions that
loaded at least one block from the tier (its hit rate, by lookup). `load_s` is the
seconds the loads were in flight, each tier's load a KVTransfer on the replica's shared
link for that tier (sim.world.link_sim), summed as the world reported each landing
(TierStack.landed). `hits_over_time`
buckets the blocks each admission found in the GPU cache and in each tier over the run
(the kv_tiers.png plot, sim.plots.kv_tiers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.core.offload_tier import TIER_NAMES, TierStack

_BUCKETS = 60  # time buckets of hits_over_time


def offload_summary(stacks: Sequence[TierStack], block_shard_bytes: float, tp: int,
                    load_mode: str) -> dict[str, Any]:
    """The tiers' figures over `stacks` (one per replica); bytes count every shard."""
    block_bytes = block_shard_bytes * tp
    per_tier: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(TIER_NAMES[:len(stacks[0].tiers)]):
        tiers = [s.tiers[i] for s in stacks]
        lookups = sum(t.num_lookups for t in tiers)
        hit_lookups = sum(t.num_hit_lookups for t in tiers)
        written = sum(t.num_spilled_blocks for t in tiers)
        loaded = sum(t.num_hit_blocks for t in tiers)
        per_tier[name] = {
            "capacity_blocks": tiers[0].capacity_blocks, "written_blocks": written,
            "loaded_blocks": loaded, "dropped_blocks": sum(t.num_dropped_blocks for t in tiers),
            f"bytes_to_{name}": written * block_bytes, f"bytes_from_{name}": loaded * block_bytes,
            "hit_rate": hit_lookups / lookups if lookups else 0.0}
    lookups = sum(s.tiers[0].num_lookups for s in stacks)
    return {"load": load_mode, "lookups": lookups, "tiers": per_tier,
            "loaded_blocks": sum(t["loaded_blocks"] for t in per_tier.values()),
            "load_s": sum(s.total_load_s for s in stacks),
            "hits_over_time": hits_over_time(stacks), "validated": False}


def hits_over_time(stacks: Sequence[TierStack], buckets: int = _BUCKETS) -> dict[str, Any]:
    """Blocks hit per time bucket, by where they came from (gpu, host, disk)."""
    names = ("gpu", *TIER_NAMES[:len(stacks[0].tiers)])
    times = np.array([t for s in stacks for t in s.hit_log_s], dtype=np.float64)
    if not times.size:
        return {"bucket_s": 0.0, "start_s": [], **{n: [] for n in names}}
    blocks = np.array([b for s in stacks for b in s.hit_log_blocks], dtype=np.int64)
    end_s = float(times.max())
    width = end_s / buckets if end_s > 0 else 1.0
    index = np.minimum((times / width).astype(np.int64), buckets - 1)
    out: dict[str, Any] = {"bucket_s": width,
                           "start_s": [i * width for i in range(buckets)]}
    for column, name in enumerate(names):
        out[name] = np.bincount(index, weights=blocks[:, column],
                                minlength=buckets).astype(np.int64).tolist()
    return out
