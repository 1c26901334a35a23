"""KV offload tiers below the GPU's prefix cache: evicted blocks spill down (LRU per tier).

vLLM's CPU offloading and LMCache keep prefix-cache blocks that the GPU pool evicts in
host memory (and LMCache on local disk), and load them back when a later request's
prefix hits them. Here a tier holds block names (sim/core/prefix.py), not contents: a
name in a tier means the block's KV can be copied back instead of recomputed.

`TierStack` is the tiers in order, host first, then the optional disk: the GPU's evicted
names go to the host tier, whose LRU drops go to the disk tier, whose drops vanish. A
lookup runs over the names after the GPU's hits while each is in some tier; each block
loads from the highest tier holding it, and that tier keeps its copy (as LMCache's store
does), refreshed in its LRU. The load is priced by `load_s` (blocks per tier -> seconds),
which the assembly builds from sim.latency.kv_transfer over each tier's Link, the one
pricing path of every KV mover; the scheduler adds it to the step (sync) or delays the
request's admission by it (async).

Capacities are in blocks; a stack of no tiers is never built (PagedBlockManager's
`offload_blocks` = 0 is the plain pool, bit for bit).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

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


def _free(_blocks: Sequence[int]) -> float:
    return 0.0


class TierStack:
    """The offload tiers, host first: spills cascade down, loads come from the highest
    tier holding each block. `asynchronous`: a load delays its request's admission instead
    of lengthening the step (vLLM's async KV load). `hit_log_s` / `hit_log_blocks`: when
    admissions hit, and the blocks each took from the GPU cache and from each tier (the
    plot of hits by tier)."""

    __slots__ = ("tiers", "load_s", "asynchronous", "last_loaded_blocks", "last_load_s",
                 "total_load_s", "hit_log_s", "hit_log_blocks")

    def __init__(self, capacities_blocks: Sequence[int],
                 load_s: Callable[[Sequence[int]], float] = _free,
                 asynchronous: bool = False) -> None:
        if not 1 <= len(capacities_blocks) <= len(TIER_NAMES):
            raise ValueError(f"offload tiers: 1 to {len(TIER_NAMES)} capacities, "
                             f"got {len(capacities_blocks)}")
        self.tiers = tuple(OffloadTier(c) for c in capacities_blocks)
        self.load_s = load_s
        self.asynchronous = asynchronous
        self.last_loaded_blocks: tuple[int, ...] = (0,) * len(self.tiers)
        self.last_load_s = 0.0  # what the last load costs (its blocks over the tiers' links)
        self.total_load_s = 0.0
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
        """Copy `names` back, each from the highest tier holding it; prices the load."""
        split: list[list[int]] = [[] for _ in self.tiers]
        for name in names:
            for tier, taken in zip(self.tiers, split, strict=True):
                if name in tier:
                    taken.append(name)
                    break
        for tier, taken in zip(self.tiers, split, strict=True):
            tier.load(taken)
        self.last_loaded_blocks = tuple(map(len, split))
        self.last_load_s = self.load_s(self.last_loaded_blocks) if names else 0.0
        self.total_load_s += self.last_load_s

    def note_hit(self, now_s: float, gpu_blocks: int) -> None:
        """An admission at `now_s` hit `gpu_blocks` in the GPU cache plus the last load."""
        self.hit_log_s.append(now_s)
        self.hit_log_blocks.append((gpu_blocks, *self.last_loaded_blocks))

    def check(self) -> None:
        for tier in self.tiers:
            tier.check()
