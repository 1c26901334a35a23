"""A disaggregated fleet in the SimPy world: prefill instances, decode instances, one link.

A request is routed to a prefill instance (`prefill_router`), which schedules it as any
request with one output token: it prefills (chunked under that instance's budget) and
emits the first token there, which is its TTFT. Its prompt's KV then moves:

1. The prefill instance keeps the prompt's blocks (held under a stand-in id) until the
   transfer ends.
2. A decode instance is picked (`decode_router`: least KV or least outstanding) and must
   hold blocks for the prompt and the first token before anything moves: the
   reservation waits, in order, until that pool has room (vLLM's NIXL connector
   allocates the decode blocks first, then pulls).
3. The prompt's KV crosses the shared link (sim.world.link_sim) as one KVTransfer
   (sim.core.kv_transfer), priced by sim.latency.kv_transfer. With `layerwise` the bytes
   left at the prefill's end are what its last step could not overlap.
4. When it lands the prefill instance frees its blocks and the request joins the decode
   instance with its prompt computed (the reservation becomes its table at admission);
   the decode instance computes the first token's KV and emits the second token.

The second token's gap (first token -> second token: transfer, reservation wait and
decode queue) and each transfer's time are kept apart (`HandoffStats`). A block is in
exactly one place or in flight (`TransferLedger`; `check` asserts it with each pool's own
invariants). Replicas run step by step here (no fast-forward), and the decode pool runs
without a prefix cache: the KV arrives whole, so a hit would only shorten what is
already computed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.core.kv_transfer import KVTransfer, TransferLedger
from sim.core.plan import StepPlan
from sim.core.request import Request
from sim.latency.kv_transfer import layerwise_remaining_bytes
from sim.results.record.recorder import RunRecorder
from sim.world.link_sim import SharedLink
from sim.world.replica import Replica
from sim.world.router import Router


def _stand_in(request_id: int) -> int:
    """The id a moving request's blocks are held under, apart from any request's own."""
    return -request_id - 1


@dataclass(slots=True)
class HandoffStats:
    """What the hand-offs cost: per request, seconds; totals in per-shard bytes."""

    transfer_s: list[float] = field(default_factory=list)
    second_token_gap_s: list[float] = field(default_factory=list)
    reservation_wait_s: list[float] = field(default_factory=list)
    # landing -> the first decode step that runs the request: the decode pool's own queue
    decode_queue_s: list[float] = field(default_factory=list)
    shard_bytes: float = 0.0
    link_busy_s: float = 0.0
    max_in_flight: int = 0


@dataclass(slots=True)
class _Moving:
    request: Request  # the original: it continues on the decode instance
    prefill: int
    decode: int
    num_blocks: int
    first_token_s: float
    first_scheduled_s: float | None
    prefix_hit_tokens: int
    num_preemptions: int
    overlap_s: float
    ready_s: float = 0.0
    sent_s: float = 0.0
    landed_s: float = 0.0


@dataclass(eq=False)
class DisaggregatedFleet:
    """The two pools, the link between them and the hand-offs in progress."""

    env: simpy.Environment
    prefill: list[Replica]
    decode: list[Replica]
    link: SharedLink
    decode_router: Router
    rng: np.random.Generator
    fleet_recorder: RunRecorder
    shard_bytes_per_token: float
    num_layers: int
    layerwise: bool
    on_done: Callable[[int], None] | None = None
    stats: HandoffStats = field(default_factory=HandoffStats)
    ledger: TransferLedger = field(default_factory=TransferLedger)
    _waiting: dict[int, _Moving] = field(default_factory=dict)  # first token out, not landed
    _reserve: list[deque[_Moving]] = field(default_factory=list)
    _second: dict[int, float] = field(default_factory=dict)  # joined decode: first token s
    _moved: dict[int, _Moving] = field(default_factory=dict)  # joined decode
    _arrivals_done: bool = False

    def add(self, side: str, replica: Replica) -> None:
        """One more instance in pool `side` ("prefill" or "decode")."""
        if side == "prefill":
            self.prefill.append(replica)
        else:
            self.decode.append(replica)
            self._reserve.append(deque())

    # -- the prefill side --------------------------------------------------------------
    def prefilled(self, index: int, copy: Request, original: Request, last_step_s: float
                  ) -> None:
        """`copy` (the request with one output token) finished on prefill instance `index`."""
        replica = self.prefill[index]
        if original.output_tokens == 1:  # nothing to decode: the prefill instance is done
            self._finish(copy)
            return
        kv = replica.kv
        assert kv is not None
        blocks = kv.blocks_for(original.prompt_tokens)
        held = kv.allocate(_stand_in(copy.request_id), original.prompt_tokens,
                           use_watermark=False)
        assert held >= 0, "the prompt's own blocks were just freed"
        self.ledger.place(copy.request_id, f"prefill-{index}", blocks)
        target = self.decode_router.choose(original, self.decode, self.rng)
        moving = _Moving(original, index, target, blocks, copy.first_token_s or self.env.now,
                         copy.first_scheduled_s, copy.prefix_hit_tokens, copy.num_preemptions,
                         last_step_s if self.layerwise else 0.0, self.env.now)
        self._waiting[copy.request_id] = moving
        self._reserve[target].append(moving)
        self._try_reserve(target)

    # -- the decode side ---------------------------------------------------------------
    def _try_reserve(self, target: int) -> None:
        """Reserve blocks on decode instance `target` for its queue of hand-offs, in order."""
        queue, kv = self._reserve[target], self.decode[target].kv
        assert kv is not None
        while queue:
            moving = queue[0]
            rid = moving.request.request_id
            if kv.allocate(_stand_in(rid), moving.request.prompt_tokens + 1) < 0:
                return
            queue.popleft()
            self._send(moving)

    def _send(self, moving: _Moving) -> None:
        rid = moving.request.request_id
        shard = moving.request.prompt_tokens * self.shard_bytes_per_token
        waited_s = self.env.now - moving.ready_s
        overlap_s = moving.overlap_s if waited_s == 0 else 0.0
        to_send = (layerwise_remaining_bytes(shard, self.num_layers, overlap_s, self.link.link)
                   if self.layerwise and overlap_s else shard)
        self.ledger.start(KVTransfer(rid, moving.num_blocks, shard, f"prefill-{moving.prefill}",
                                     f"decode-{moving.decode}"))
        self.stats.reservation_wait_s.append(waited_s)
        self.stats.shard_bytes += shard
        moving.sent_s = self.env.now
        self.link.send(to_send).callbacks.append(lambda _event: self._landed(rid))
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.ledger.num_in_flight)

    def _landed(self, rid: int) -> None:
        moving = self._waiting.pop(rid)
        self.ledger.land(rid)
        self.stats.transfer_s.append(self.env.now - moving.sent_s)
        moving.landed_s = self.env.now
        prefill = self.prefill[moving.prefill]
        assert prefill.kv is not None
        prefill.kv.free(_stand_in(rid))
        prefill.wake()
        decode = self.decode[moving.decode]
        assert decode.kv is not None
        decode.kv.free(_stand_in(rid))  # the reservation becomes the request's own table
        self.ledger.drop(rid)
        request = moving.request
        request.num_computed_tokens = request.prompt_tokens
        request.num_output_done = 1
        request.first_token_s = moving.first_token_s
        self._second[rid] = moving.first_token_s
        self._moved[rid] = moving
        decode.submit(request)
        self._close_if_done()

    def decode_step(self, index: int, plan: StepPlan, delivery_s: float) -> None:
        """A step of decode instance `index` ended: second tokens out, room perhaps freed."""
        if self._second:
            for rid, emits in zip(plan.request_ids, plan.emits_token, strict=True):
                first_s = self._second.pop(rid, None) if emits else None
                if first_s is not None:
                    self.stats.second_token_gap_s.append(self.env.now + delivery_s - first_s)
        self._try_reserve(index)

    def decoded(self, request: Request) -> None:
        """A request finished on a decode instance: record it once, with its prefill's times."""
        moving = self._moved.pop(request.request_id)
        self._second.pop(request.request_id, None)
        if request.first_scheduled_s is not None:  # its decode instance's admission
            self.stats.decode_queue_s.append(request.first_scheduled_s - moving.landed_s)
        request.first_scheduled_s = moving.first_scheduled_s
        request.prefix_hit_tokens = moving.prefix_hit_tokens
        request.num_preemptions += moving.num_preemptions
        self._finish(request)

    def _finish(self, request: Request) -> None:
        self.fleet_recorder.record_finished(request)
        if self.on_done is not None:
            self.on_done(1)
        self._close_if_done()

    def arrivals_done(self) -> None:
        self._arrivals_done = True
        self._close_if_done()

    def _close_if_done(self) -> None:
        """No more requests can reach the decode pool: close it (static batching's last)."""
        if self._arrivals_done and not self._waiting and all(
                r.scheduler.num_waiting + r.scheduler.num_running == 0 for r in self.prefill):
            for replica in self.decode:
                replica.close()

    def check(self) -> None:
        """Every block is in one place or in flight: each pool's own accounting holds, the
        prefill side holds every moving prompt until it lands, and the decode side holds a
        reservation for every transfer in flight."""
        for side, replicas in (("prefill", self.prefill), ("decode", self.decode)):
            for i, replica in enumerate(replicas):
                kv = replica.kv
                assert kv is not None
                getattr(kv, "check_invariants", lambda: None)()
                for rid, moving in self._waiting.items():
                    mine = moving.prefill == i if side == "prefill" else (
                        moving.decode == i and self.ledger.where(rid) == "in flight")
                    want = (moving.num_blocks if side == "prefill"
                            else kv.blocks_for(moving.request.prompt_tokens + 1)) if mine else 0
                    held = len(kv.block_table(_stand_in(rid)))
                    assert held == want, f"{side}-{i} holds {held} blocks of {rid}, not {want}"
                    where = self.ledger.where(rid)
                    assert where in ("in flight", f"prefill-{moving.prefill}"), where
