"""What moving KV blocks costs: the one pricing path for every mover of KV.

Three things move KV between owners: swap preemption (GPU <-> host pool), prefill ->
decode transfers of a disaggregated fleet, and the offload tiers' loads (host or disk ->
GPU). All three are `KVTransfer`s (sim.core.kv_transfer) priced here, over a `Link`
(sim.config.link), which the world (sim.world.link_sim) schedules where they share a
link. A step's synchronous moves (swaps, sync tier loads) hold its GPU stream: the step
costs `step_time(shape, moved_s)` with `moved_s = step_moves_s(...)`, their price on idle
links, and the world adds whatever sharing a link made them late.

Bytes: a transfer carries `tokens x kv_bytes_per_token(model, tp)` bytes per GPU, each
GPU's shard over its own lane (the Link's bandwidth is one GPU's, per direction, as
nccl-tests' busbw), so the time is that of one shard; the total moved is the shard x tp.

Time on an idle link: latency + bytes / bandwidth (`transfer_s`; a free link,
`bandwidth: null`, costs its latency only). Transfers in flight together share the link
fairly (processor sharing): each first pays its own latency (a fixed cost, not shared),
then the n transfers moving bytes each get bandwidth / n. `shared_finish_s` computes the
finish times of a set of transfers exactly; the world advances the same law
(`drain`, `next_finish_s`) one event at a time, so the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sim.config.costs import kv_bytes_per_token
from sim.config.link import Link, transfer_s
from sim.config.specs import ModelSpec
from sim.core.kv_transfer import KVTransfer

__all__ = ["drain", "kv_shard_bytes", "kv_transfer_s", "layerwise_remaining_bytes",
           "link_bytes", "next_finish_s", "shared_finish_s", "step_moves_s"]


def kv_shard_bytes(model: ModelSpec, num_tokens: int, tp: int = 1) -> float:
    """Bytes one GPU of a `tp`-way replica holds for `num_tokens` tokens of KV (its shard):
    the model's attention kind and KV dtype, as the pool is sized (sim.config.costs)."""
    return num_tokens * kv_bytes_per_token(model, tp)


def kv_transfer_s(link: Link, shard_bytes: float) -> float:
    """Seconds to move one shard of `shard_bytes` over an idle `link`: latency +
    bytes / bandwidth (a free link: its latency; nothing to move: 0)."""
    return transfer_s(link, shard_bytes)


def link_bytes(moves: Sequence[KVTransfer]) -> dict[str, float]:
    """Each link's bytes (one GPU's shard) among `moves`, in the order links first appear,
    leaving out links that carry none: what a step's synchronous moves put on each link,
    sent together as one transfer."""
    out: dict[str, float] = {}
    for move in moves:
        if move.shard_bytes:
            out[move.link] = out.get(move.link, 0) + move.shard_bytes
    return out


def step_moves_s(links: Mapping[str, Link], moves: Sequence[KVTransfer]) -> float:
    """Seconds a step's synchronous KV moves take on idle links: each link carries its
    moves' bytes together (latency + bytes / bandwidth: moves issued together on a fairly
    shared link finish together), the links in parallel (the slowest). 0: no moves."""
    return max((kv_transfer_s(links[name], shard_bytes)
                for name, shard_bytes in link_bytes(moves).items()), default=0.0)


def layerwise_remaining_bytes(shard_bytes: float, num_layers: int, overlap_s: float,
                              link: Link) -> float:
    """Bytes still to move when a layer-wise transfer overlapped `overlap_s` of compute.

    Layer by layer the KV leaves as the prefill's last step writes it, so an idle link has
    moved up to `overlap_s x bandwidth` by the step's end; the last layer's share is
    written at the end and always remains."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    last_layer = shard_bytes / num_layers
    bw = link.bandwidth_bytes_per_s
    if bw is None:
        return last_layer
    return max(last_layer, shard_bytes - overlap_s * bw)


def drain(remaining: Sequence[float], bandwidth: float, elapsed_s: float) -> list[float]:
    """Bytes left in each of n transfers sharing `bandwidth` after `elapsed_s` (each moved
    elapsed x bandwidth / n; never below 0)."""
    if not remaining:
        return []
    moved = elapsed_s * bandwidth / len(remaining)
    return [max(0.0, r - moved) for r in remaining]


def next_finish_s(remaining: Sequence[float], bandwidth: float) -> float:
    """Seconds until the first of n transfers sharing `bandwidth` is done (inf: none)."""
    if not remaining:
        return math.inf
    return min(remaining) * len(remaining) / bandwidth


def shared_finish_s(link: Link, starts_s: Sequence[float], shard_bytes: Sequence[float]
                    ) -> list[float]:
    """When each transfer, issued at `starts_s[i]` with `shard_bytes[i]`, is done on `link`.

    Each pays the latency alone, then shares the bandwidth with every transfer moving bytes
    at the same time. One transfer alone: start + kv_transfer_s. The reference the world's
    link must equal (tests/test_kv_transfer.py)."""
    if len(starts_s) != len(shard_bytes):
        raise ValueError("starts_s and shard_bytes differ in length")
    n = len(starts_s)
    done = [math.nan] * n
    bw = link.bandwidth_bytes_per_s
    ready = sorted(range(n), key=lambda i: (starts_s[i] + link.latency_s, i))
    if bw is None:
        for i in ready:
            done[i] = starts_s[i] + (link.latency_s if shard_bytes[i] else 0.0)
        return done
    moving: dict[int, float] = {}
    now, k = -math.inf, 0
    while k < n or moving:
        join_s = starts_s[ready[k]] + link.latency_s if k < n else math.inf
        finish_s = now + next_finish_s(list(moving.values()), bw) if moving else math.inf
        if join_s <= finish_s:
            if moving:
                moving = dict(zip(moving, drain(list(moving.values()), bw, join_s - now),
                                  strict=True))
            now = join_s
            i = ready[k]
            k += 1
            if not shard_bytes[i]:
                done[i] = starts_s[i]
            else:
                moving[i] = float(shard_bytes[i])
            continue
        left = drain(list(moving.values()), bw, finish_s - now)
        now = finish_s
        first = min(moving, key=moving.__getitem__)
        moving = dict(zip(moving, left, strict=True))
        for i in [i for i, r in moving.items() if r <= 0.0 or i == first]:
            done[i] = now
            del moving[i]
    return done
