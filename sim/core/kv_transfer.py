"""KV that moves: one transfer value for every mover, and the ledger that conserves blocks.

Swap preemption (GPU pool <-> host pool), a disaggregated fleet's prefill -> decode
hand-off and the offload tiers' loads (host or disk -> GPU) all move a request's KV
blocks from one owner to another. Each move is a `KVTransfer`: what it carries (blocks,
and bytes per GPU shard), from where, to where, over which of its owner's links, and
whether the step that issued it waits for it (`sync`) or only its request does. Its
price is a pure function of the bytes and a link (sim.latency.kv_transfer); when it
runs, among the others sharing the link, is the world's (sim.world.link_sim), which
tells the scheduler when it landed. No clock is read here.

`TransferLedger` is the conservation check of item 5 of issue 48: a block is in exactly
one place or in flight. A transfer's blocks are held at its source until it lands (the
sender frees them when the transfer ends) and reserved at its destination from the
start, so a block in flight is counted once, as `in_flight`, and never twice.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVTransfer:
    """One move of a request's KV: `num_blocks` blocks, `shard_bytes` per GPU shard.

    `src` and `dst` name the owners (e.g. "prefill-0", "decode-1", "host", "gpu").
    `link`: which of the replica's links it crosses ("host", "disk"; "" where the world
    has one link, a disaggregated fleet's). `sync`: the step that issued it runs only
    once it has landed (a synchronous tier load); else only its request waits."""

    request_id: int
    num_blocks: int
    shard_bytes: float
    src: str
    dst: str
    link: str = ""
    sync: bool = False

    def __post_init__(self) -> None:
        if self.num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {self.num_blocks}")
        if not self.shard_bytes >= 0:
            raise ValueError(f"shard_bytes must be >= 0, got {self.shard_bytes}")
        if self.src == self.dst:
            raise ValueError(f"a transfer moves between two owners, got {self.src!r} twice")


def swap_move(request_id: int, num_blocks: int, block_shard_bytes: float,
              swap_in: bool = False) -> KVTransfer:
    """Swap preemption's copy of `num_blocks` blocks between the GPU pool and the host swap
    pool ("swap"), over the host link; the step that swaps waits for it (sync)."""
    src, dst = ("swap", "gpu") if swap_in else ("gpu", "swap")
    return KVTransfer(request_id, num_blocks, num_blocks * block_shard_bytes, src, dst,
                      "host", sync=True)


class TransferLedger:
    """Where each moving request's blocks are: at rest with one owner, or in flight."""

    __slots__ = ("_at_rest", "_in_flight")

    def __init__(self) -> None:
        self._at_rest: dict[int, tuple[str, int]] = {}  # request -> (owner, blocks)
        self._in_flight: dict[int, KVTransfer] = {}

    def place(self, request_id: int, owner: str, num_blocks: int) -> None:
        """The request's KV now rests with `owner` (after its prefill, or a landing)."""
        if request_id in self._in_flight:
            raise AssertionError(f"request {request_id} placed while in flight")
        self._at_rest[request_id] = (owner, num_blocks)

    def start(self, transfer: KVTransfer) -> None:
        """`transfer` leaves its source; the blocks are now in flight, not at rest."""
        rid = transfer.request_id
        at = self._at_rest.pop(rid, None)
        if at is None or at[0] != transfer.src:
            raise AssertionError(f"request {rid}'s KV is not at {transfer.src!r} ({at})")
        if at[1] != transfer.num_blocks:
            raise AssertionError(f"request {rid} moves {transfer.num_blocks} blocks, "
                                 f"holds {at[1]}")
        self._in_flight[rid] = transfer

    def land(self, request_id: int) -> KVTransfer:
        """The transfer arrived: its blocks rest at the destination."""
        transfer = self._in_flight.pop(request_id)
        self._at_rest[request_id] = (transfer.dst, transfer.num_blocks)
        return transfer

    def drop(self, request_id: int) -> None:
        """The request's moved KV is no longer tracked (it joined its owner's pool)."""
        self._at_rest.pop(request_id, None)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def blocks_at(self, owner: str) -> int:
        return sum(n for o, n in self._at_rest.values() if o == owner)

    def blocks_in_flight(self) -> int:
        return sum(t.num_blocks for t in self._in_flight.values())

    def where(self, request_id: int) -> str | None:
        """The owner holding the request's tracked KV, 'in flight', or None."""
        if request_id in self._in_flight:
            return "in flight"
        at = self._at_rest.get(request_id)
        return None if at is None else at[0]
