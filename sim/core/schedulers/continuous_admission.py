"""vLLM's admission for the continuous scheduler: the waiting queue's side of a step.

Which requests can never run (rejected at add()), what a contiguous pool reserves
for one, the FCFS admission of waiting requests while budget, seats and blocks last
(prefix hits, swap-ins, the watermark, `scheduler_reserve_full_isl`), and the
preemption that sends a running request back to the front of the queue. The rules
are vLLM's (continuous.py's module doc says them whole; docs/vllm_parity.md maps
them to vLLM's code).

It is apart from continuous.py, which holds the scheduler's state, its contract and
the order of a step (running set first, running_batch.py, then this), because it is
a self-contained half of vLLM's schedule(): one request at a time, in plain Python,
against the pool. ContinuousAdmission is a base of ContinuousScheduler, whose
__init__ sets every attribute named in the class body.
"""

from __future__ import annotations

from collections import deque

from sim.core.kv import KVManager, PagedBlockManager
from sim.core.kv_transfer import KVTransfer, swap_move
from sim.core.offload_tier import TIER_NAMES
from sim.core.plan import StepPlan
from sim.core.request import Request, RequestState
from sim.core.schedulers.limits import LengthLimits
from sim.core.schedulers.plan_builder import PlanBuilder
from sim.core.schedulers.running_batch import RunningBatch
from sim.core.schedulers.speculation import Speculation


class ContinuousAdmission:
    """Admission from the waiting queue and preemption back to it (see the module doc)."""

    # set by ContinuousScheduler.__init__
    kv: KVManager
    limits: LengthLimits
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    max_model_len: int | None
    scheduler_reserve_full_isl: bool
    waiting: deque[Request]
    running: list[Request]
    kv_blocked: bool
    num_recomputed_tokens: int
    num_swap_fallbacks: int
    _in_flight: dict[int, Request]
    _swap: bool
    _paged: PagedBlockManager | None
    _prefix_cache: bool
    _swap_out_pending: list[KVTransfer]
    _blocked: tuple[Request, int] | None
    _spec: Speculation
    _batch: RunningBatch
    _outstanding: deque[StepPlan]
    _stale: dict[int, Request]
    _loading: dict[int, tuple[Request, int]]
    _moves: list[KVTransfer]

    def _never_fits(self, request: Request) -> str | None:
        reason = self.limits.never_fits(request, self.kv)
        if reason is not None:
            return reason
        if not self.chunked_prefill and request.prompt_tokens > self.max_num_batched_tokens:
            return (f"prompt {request.prompt_tokens} > max_num_batched_tokens "
                    f"{self.max_num_batched_tokens} with chunked prefill off")
        if not self._spec.k or self._paged is not None:
            return None
        reserve = self._reserve_tokens(request)
        if reserve is not None and self.kv.blocks_for(reserve) > self.kv.num_usable_blocks:
            return (f"reserves {reserve} KV tokens (prompt + max output + "
                    f"{self._spec.k} drafts), pool holds "
                    f"{self.kv.num_usable_blocks * self.kv.block_size}")
        return None

    def _reserve_tokens(self, request: Request) -> int | None:
        """A contiguous reservation: prompt + maximum output, + k draft slots when speculating."""
        reserve = self.limits.reserve_tokens(request)
        if reserve is None or not self._spec.k:
            return reserve
        reserve += self._spec.k
        return reserve if self.max_model_len is None else min(reserve, self.max_model_len)

    def _admit(self, room: int, step: PlanBuilder, now: float, running_scheduled: bool,
               prefill_scheduled: bool) -> None:
        """Admit waiting requests FCFS while budget, seats and blocks last."""
        self.kv_blocked = False
        waiting, running, spec = self.waiting, self.running, self._spec
        slots = spec.draft_slots
        if self._loading:
            room = self._admit_loaded(room, step, now)
        if not waiting or room <= slots or len(running) >= self.max_num_seqs:
            return
        kv, batch, k, in_flight = self.kv, self._batch, spec.k, self._in_flight
        prefix_cache = self._prefix_cache
        naming = self._paged if prefix_cache else None
        paged = self._paged if self._swap else None
        contiguous = self._paged is None  # only a contiguous pool reserves up front
        full_isl = self.scheduler_reserve_full_isl
        while waiting and room > slots and len(running) < self.max_num_seqs:
            avail = room - slots
            req = waiting[0]
            rid = req.request_id
            counters = req.counters()
            computed = context = counters[0]  # context: the KV before the step (hits aside)
            done = counters[1]
            swapped = paged is not None and paged.is_swapped(rid)
            if prefix_cache and not computed:
                computed = kv.cached_prefix_tokens(req)
            known = req.prompt_tokens + done
            new = known - computed
            drafts = 0
            if k and new == 1 and spec.pads(computed, running_scheduled, prefill_scheduled):
                # vLLM pads a decode admitted among decodes to 1 + k (CUDA-graph shape)
                if 1 + k > avail:
                    break
                new, drafts = 1 + k, k
            if new > avail:
                # without chunking a prefill waits for a step with room, unless it can
                # never have room (a recompute longer than the whole budget): chunk it
                if not self.chunked_prefill and new <= self.max_num_batched_tokens - slots:
                    break
                new = avail
            full = known if full_isl else None
            need = spec.slots(computed + new) if k else computed + new
            if swapped:
                assert paged is not None
                moved = paged.swap_in(rid, need, bool(running), req if prefix_cache else None,
                                      full)
                if moved < 0:
                    self.kv_blocked = True
                    self._blocked = (req, kv.num_free_blocks)
                    break
                step.swap_in_tokens += moved * kv.block_size
                self._moves.append(swap_move(rid, moved, paged.block_shard_bytes, swap_in=True))
            else:
                hits = kv.allocate(rid, need, use_watermark=bool(running),
                                   reserve_tokens=self._reserve_tokens(req) if contiguous
                                   else None,
                                   request=req if prefix_cache else None,
                                   full_sequence_tokens=full)
                if hits < 0:
                    self.kv_blocked = True
                    self._blocked = (req, kv.num_free_blocks)
                    break
                if hits:  # only from zero computed tokens: the lookup above saw the same
                    req.num_computed_tokens = context = hits
                    counters = (hits, done, counters[2], counters[3])
                    if naming is not None and naming.offload is not None:
                        tiers = naming.offload  # blocks loaded back from the offload tiers
                        tiers.note_hit(now, (hits - naming.loaded_tokens) // kv.block_size)
                        moves = tiers.transfers(rid)  # the world sends them (take_transfers)
                        self._moves += moves
                        if moves and tiers.asynchronous:
                            # vLLM's async KV load: the request waits outside the running
                            # set, its blocks held, until the world says its loads landed
                            # (kv_landed); others go on. Sync: the step waits for them
                            waiting.popleft()
                            self._loading[rid] = (req, len(moves))
                            continue
            if naming is not None:
                naming.cache_computed(rid, min(computed + new, known))
            waiting.popleft()
            running.append(req)
            req.state = RequestState.RUNNING
            if req.first_scheduled_s is None:
                req.prefix_hit_tokens = context
                req.first_scheduled_s = now
                in_flight[rid] = req
            table = kv.block_table(rid)
            step.add(new, context, known, done, drafts)
            batch.admitted(req, table, new, counters, context + new - drafts == known)
            room -= new + slots

    def _admit_loaded(self, room: int, step: PlanBuilder, now: float) -> int:
        """Requests whose tier loads have all landed join the running set (before the queue,
        as vLLM schedules a request whose remote KV arrived), in the order they were
        parked; returns the room left."""
        kv, batch, running, slots = self.kv, self._batch, self.running, self._spec.draft_slots
        naming = self._paged
        assert naming is not None  # only a prefix-caching paged pool has tiers
        loading = self._loading
        for rid, (req, in_flight) in list(loading.items()):
            if in_flight or room <= slots or len(running) >= self.max_num_seqs:
                continue
            counters = req.counters()
            computed, done = counters[0], counters[1]
            known = req.prompt_tokens + done
            # the blocks allocated at admission, less the budget left now
            new = min(known - computed, naming.num_slots(rid) - computed, room - slots)
            if new < known - computed and not self.chunked_prefill:
                continue
            del loading[rid]
            naming.cache_computed(rid, computed + new)
            running.append(req)
            req.state = RequestState.RUNNING
            if req.first_scheduled_s is None:
                req.prefix_hit_tokens = computed
                req.first_scheduled_s = now
                self._in_flight[rid] = req
            step.add(new, computed, known, done, 0)
            batch.admitted(req, kv.block_table(rid), new, counters, computed + new == known)
            room -= new + slots
        return room

    def _abort_loading(self, request_id: int, now: float) -> Request | None:
        """Drop a request whose tier load is under way (its blocks free at once; the load's
        landing, when the world reports it, changes nothing)."""
        entry = self._loading.pop(request_id, None)
        if entry is None:
            return None
        self.kv.free(request_id)
        entry[0].abort(now)
        return entry[0]

    def take_transfers(self) -> tuple[KVTransfer, ...]:
        """The KV moves issued since the last call (the world sends each on its link): a
        sync one belongs to the plan just scheduled, which runs once it has landed."""
        if not self._moves:
            return ()
        moves, self._moves = tuple(self._moves), []
        return moves

    def kv_landed(self, transfer: KVTransfer, in_flight_s: float) -> None:
        """The world: `transfer` landed after `in_flight_s` seconds on its link. An async
        load's request becomes admittable once all its loads have landed."""
        tiers = self._paged.offload if self._paged is not None else None
        if tiers is not None and transfer.src in TIER_NAMES:
            tiers.landed(in_flight_s)
        if transfer.sync:
            return
        entry = self._loading.get(transfer.request_id)
        if entry is not None:  # else aborted while loading
            self._loading[transfer.request_id] = (entry[0], entry[1] - 1)

    def _preempt(self, req: Request) -> None:
        """Re-queue `req` at the front; its counters must be exact (the batch syncs them)."""
        req.num_preemptions += 1
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)
        outstanding = self._outstanding
        if outstanding and req.request_id in outstanding[0].request_ids:
            self._stale[req.request_id] = req  # the running step still delivers its outputs
        # with no one else running nothing will free blocks for a swap-in (a lone request
        # whose drafts outgrow the pool): recompute, as vLLM does
        if self._swap and self._paged is not None and self.running:
            moved = self._paged.swap_out(req.request_id)
            if moved >= 0:
                self._swap_out_pending.append(swap_move(req.request_id, moved,
                                                         self._paged.block_shard_bytes))
                return
            self.num_swap_fallbacks += 1
        self.kv.free(req.request_id)
        self.num_recomputed_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0
