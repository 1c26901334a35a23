"""KV offload tiers below the GPU's prefix cache: evicted blocks spill down (LRU per tier).

vLLM's CPU offloading and LMCache keep prefix-cache blocks that the GPU pool evicts in
host memory (and LMCache on local disk), and load them back when a later request's
prefix hits them. Here a tier holds block names (sim/core/prefix.py), not contents: a
name in a tier means the block's KV can be copied back instead of recomputed.

`TierStack` is the tiers in order, host first, then the optional disk: the GPU's evicted
names go to the host tier, whose LRU drops go to the disk tier, whose drops vanish. A
lookup runs over the names after the GPU's hits while each is in some tier; each block
loads from the highest tier holding it, and that tier keeps its copy (as LMCache's store
does), refreshed in its LRU. A load is one `KVTransfer` per tier it takes blocks from
(`transfers`), over that tier's link, named after the tier ("host", "disk"): the one path
of every KV mover (sim.core.kv_transfer). The world sends them on the replica's shared
links, priced by sim.latency.kv_transfer, and reports each landing (`landed`, the
seconds it was in flight, summed as `total_load_s`). A sync load holds the step that
admitted its request until it lands; an async one holds only its request (the scheduler
parks it until the world says it landed).

Capacities are in blocks; a stack of no tiers is never built (PagedBlockManager's
`offload_blocks` = 0 is the plain pool, bit for bit).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from sim.core.kv_transfer import KVTransfer

TIER_NAMES = ("host", "disk")


class OffloadTier:
    """Names of evicted cached blocks, LRU, at most `capacity_blocks` of them."""

    __slots__ = ("capacity_blocks", "_names", "num_spilled_blocks", "num_dropped_blocks",
                 "num_hit_blocks", "num_lookups", "num_hit_lookups")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"an offload tier holds >= 1 block, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._names: OrderedDict[int, None] = OrderedDict()
        self.num_spilled_blocks = 0  # blocks written down into this tier
        self.num_dropped_blocks = 0  # names pushed out of the tier by newer ones
        self.num_hit_blocks = 0  # blocks loaded back (tier -> GPU)
        self.num_lookups = 0  # admissions that looked here
        self.num_hit_lookups = 0  # ... and loaded at least one block from here

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: int) -> bool:
        return name in self._names

    def spill(self, names: Iterable[int]) -> list[int]:
        """Names go down into this tier; returns the oldest, pushed out when it is full."""
        stored = self._names
        dropped: list[int] = []
        for name in names:
            if name in stored:
                stored.move_to_end(name)
                continue
            stored[name] = None
            self.num_spilled_blocks += 1
            if len(stored) > self.capacity_blocks:
                dropped.append(stored.popitem(last=False)[0])
        self.num_dropped_blocks += len(dropped)
        return dropped

    def run_length(self, names: Sequence[int]) -> int:
        """How many of `names`, from the first, the tier holds (no side effects)."""
        stored = self._names
        count = 0
        for name in names:
            if name not in stored:
                break
            count += 1
        return count

    def load(self, names: Sequence[int]) -> None:
        """`names` are copied back to the GPU: counted, and made most recently used."""
        self.num_lookups += 1
        if not names:
            return
        self.num_hit_lookups += 1
        self.num_hit_blocks += len(names)
        stored = self._names
        for name in names:
            if name in stored:  # taking the blocks' room may have pushed it out just now
                stored.move_to_end(name)

    def check(self) -> None:
        assert len(self._names) <= self.capacity_blocks, "offload tier over capacity"


class TierStack:
    """The offload tiers, host first: spills cascade down, loads come from the highest
    tier holding each block. `block_shard_bytes`: one GPU's shard of a block (what each
    loaded block puts on the link). `asynchronous`: a load delays its request's admission
    instead of holding the step (vLLM's async KV load). `hit_log_s` / `hit_log_blocks`:
    when admissions hit, and the blocks each took from the GPU cache and from each tier
    (the plot of hits by tier)."""

    __slots__ = ("tiers", "block_shard_bytes", "asynchronous", "last_loaded_blocks",
                 "total_load_s", "hit_log_s", "hit_log_blocks")

    def __init__(self, capacities_blocks: Sequence[int], block_shard_bytes: float = 0.0,
                 asynchronous: bool = False) -> None:
        if not 1 <= len(capacities_blocks) <= len(TIER_NAMES):
            raise ValueError(f"offload tiers: 1 to {len(TIER_NAMES)} capacities, "
                             f"got {len(capacities_blocks)}")
        if not block_shard_bytes >= 0:
            raise ValueError(f"block_shard_bytes must be >= 0, got {block_shard_bytes}")
        self.tiers = tuple(OffloadTier(c) for c in capacities_blocks)
        self.block_shard_bytes = block_shard_bytes
        self.asynchronous = asynchronous
        self.last_loaded_blocks: tuple[int, ...] = (0,) * len(self.tiers)
        self.total_load_s = 0.0  # seconds loads were in flight, as the world reported them
        self.hit_log_s: list[float] = []
        self.hit_log_blocks: list[tuple[int, ...]] = []  # (gpu, host[, disk]) per hit

    def __len__(self) -> int:
        return sum(len(t) for t in self.tiers)

    def __contains__(self, name: int) -> bool:
        return any(name in t for t in self.tiers)

    def spill(self, names: Iterable[int]) -> None:
        """GPU-evicted names go to the top tier; each tier's LRU drops go one tier down."""
        going = list(names)
        for tier in self.tiers:
            if not going:
                return
            going = tier.spill(going)

    def run_length(self, names: Sequence[int]) -> int:
        """How many of `names`, from the first, some tier holds (no side effects)."""
        tiers = self.tiers
        count = 0
        for name in names:
            if not any(name in t for t in tiers):
                break
            count += 1
        return count

    def load(self, names: Sequence[int]) -> None:
        """Copy `names` back, each from the highest tier holding it (`transfers` says what
        crosses the links)."""
        split: list[list[int]] = [[] for _ in self.tiers]
        for name in names:
            for tier, taken in zip(self.tiers, split, strict=True):
                if name in tier:
                    taken.append(name)
                    break
        for tier, taken in zip(self.tiers, split, strict=True):
            tier.load(taken)
        self.last_loaded_blocks = tuple(map(len, split))

    def transfers(self, request_id: int) -> tuple[KVTransfer, ...]:
        """The last load as moves: one per tier it took blocks from, over that tier's link,
        sync unless the stack is asynchronous."""
        shard, sync = self.block_shard_bytes, not self.asynchronous
        return tuple(KVTransfer(request_id, blocks, blocks * shard, name, "gpu", name, sync)
                     for name, blocks in zip(TIER_NAMES, self.last_loaded_blocks, strict=False)
                     if blocks)

    def landed(self, in_flight_s: float) -> None:
        """The world: one of the loads landed after `in_flight_s` seconds on its link."""
        self.total_load_s += in_flight_s

    def note_hit(self, now_s: float, gpu_blocks: int) -> None:
        """An admission at `now_s` hit `gpu_blocks` in the GPU cache plus the last load."""
        self.hit_log_s.append(now_s)
        self.hit_log_blocks.append((gpu_blocks, *self.last_loaded_blocks))

    def check(self) -> None:
        for tier in self.tiers:
            tier.check()
