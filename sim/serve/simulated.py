"""The simulated backend: a scenario's scheduler, KV pool and latency model on the wall clock.

No torch and no GPU: each step is held for the latency model's prediction
(roofline or a calibration table), then applied, so every token is released at
its simulated time. Output lengths are scripted as in the simulator: a request
generates exactly `max_tokens` tokens (EOS never stops it, as with vLLM's
`ignore_eos`); without `max_tokens`, 16 for a completion (OpenAI's default)
and 256 for a chat, capped by the context. The text is a fixed passage in the
scenario's tokenizer, started at a place the request's seed picks: sampling
parameters are checked, but a simulated model has no logits to sample.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sim.assemble import build_latency, build_replica, kv_budget, synchronous
from sim.config.link import Link
from sim.config.scenario import Scenario
from sim.core.drive import EMPTY
from sim.core.kv import KVBudget, KVManager
from sim.core.plan import StepPlan, StepResult
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.latency import LatencyModel
from sim.latency.draft import with_draft
from sim.latency.kv_transfer import kv_transfer_s, link_bytes, step_moves_s
from sim.serve.api import Generation
from sim.serve.stepper import StepDone
from sim.text.base import Tokenizer
from sim.world.speculation import build_speculation

PASSAGE = ("Serving a language model is a scheduling problem: every step the engine "
           "decides which requests run, how many tokens each computes, and whose cache "
           "blocks stay on the device. ")
DEFAULT_MAX_TOKENS = {False: 16, True: 256}  # completions (OpenAI's default), chat


def default_output_tokens(generation: Generation, max_model_len: int) -> int:
    """How many tokens a request generates: its max_tokens, else the default, within context."""
    if generation.max_tokens is not None:
        return generation.max_tokens
    room = max_model_len - len(generation.prompt_ids)
    return max(1, min(DEFAULT_MAX_TOKENS[generation.chat], room))


@dataclass(slots=True, eq=False)
class SimulatedStepper:
    """The loop's Stepper over a latency model; `clock` is seconds since the server started."""

    scheduler: Scheduler
    kv: KVManager
    latency: LatencyModel
    tokenizer: Tokenizer
    speculate: Callable[[StepPlan], StepResult] | None = None
    links: Mapping[str, Link] = field(default_factory=dict)  # the KV moves' links, by name
    _origin_s: float = field(default_factory=time.perf_counter)
    _passage: tuple[int, ...] = ()
    _offsets: dict[int, int] = field(default_factory=dict)  # request -> next passage index

    def __post_init__(self) -> None:
        self._passage = tuple(self.tokenizer.encode(PASSAGE))

    def clock(self) -> float:
        return time.perf_counter() - self._origin_s

    def add(self, request: Request, generation: Generation, at_s: float) -> bool:
        seed = (generation.seed if generation.seed is not None else 0) + generation.child_index
        self._offsets[request.request_id] = seed % len(self._passage)
        return self.scheduler.add(request, at_s)

    def abort(self, request_id: int, at_s: float) -> Request | None:
        self._offsets.pop(request_id, None)
        return self.scheduler.abort(request_id, at_s)

    async def step(self, start_s: float, admit_until: Callable[[float], None]
                   ) -> StepDone | None:
        scheduler = self.scheduler
        plan = scheduler.schedule(start_s)
        if plan is None:
            return None
        held = scheduler.kv_slots_held
        moved_s = self._moved_s()
        duration_s = (self.latency.step_time(plan.shape, moved_s) if moved_s
                      else self.latency.step_time(plan.shape))
        end_s = start_s + duration_s
        wait_s = end_s - self.clock()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        admit_until(end_s)
        result = EMPTY if self.speculate is None else self.speculate(plan)
        finished = scheduler.on_step_done(plan, result, end_s)
        tokens = self._tokens(plan, result)
        for request in finished:
            self._offsets.pop(request.request_id, None)
        return StepDone(start_s, duration_s, plan, finished, tokens, held,
                        None if self.speculate is None else result)

    def _moved_s(self) -> float:
        """The step's synchronous KV moves (swaps, sync tier loads; build_simulated refuses
        async ones) on idle links (sim.latency.kv_transfer.step_moves_s): nothing else is
        in flight on them, so each lands then."""
        take = getattr(self.scheduler, "take_transfers", None)
        moves = take() if take is not None else ()
        if not moves:
            return 0.0
        for name, shard_bytes in link_bytes(moves).items():
            landed_s = kv_transfer_s(self.links[name], shard_bytes)
            for transfer in moves:
                if transfer.link == name:
                    self.scheduler.kv_landed(transfer, landed_s)  # type: ignore[attr-defined]
        return step_moves_s(self.links, moves)

    def _tokens(self, plan: StepPlan, result: StepResult) -> list[tuple[int, int]]:
        """The passage's next tokens for every emitting sequence (1 + accepted drafts each);
        the loop stops a stream at its scripted length."""
        passage, offsets = self._passage, self._offsets
        emitters = [rid for rid, e in zip(plan.request_ids, plan.emits_token, strict=True) if e]
        counts = result.num_emitted or (1,) * len(emitters)
        tokens = []
        for rid, count in zip(emitters, counts, strict=True):
            at = offsets.get(rid, 0)
            for i in range(count):
                tokens.append((rid, passage[(at + i) % len(passage)]))
            offsets[rid] = at + count
        return tokens


@dataclass(frozen=True, slots=True)
class SimulatedBackend:
    """What `servesim serve` builds from a scenario: the stepper and what the API checks."""

    stepper: SimulatedStepper
    budget: KVBudget
    max_model_len: int
    latency_name: str


def build_simulated(scenario: Scenario, tokenizer: Tokenizer, base_dir: Path | None = None
                    ) -> SimulatedBackend:
    """The scenario's one replica (sim.assemble), with its latency model and speculation. The
    loop steps it synchronously, and its real HTTP stack, tokenizer and detokenizer are the
    frontend a client sees (nothing is slept for them)."""
    if scenario.hardware.data_parallel > 1:  # ranks in lockstep: sim.world.dp_group only
        raise ValueError(f"hardware.data_parallel: `servesim serve` serves one replica's "
                         f"scheduler, not {scenario.hardware.data_parallel} data-parallel "
                         "ranks in lockstep; simulate them with `servesim run`")
    if scenario.kv.offload_host_gib and scenario.kv.offload_load == "async":
        raise ValueError("kv.offload_load: `servesim serve` loads offload tiers "
                         "synchronously; set it to sync, or simulate async loads with "
                         "`servesim run`")
    scenario = synchronous(scenario)
    budget = kv_budget(scenario)
    parts = build_replica(scenario, budget)
    latency = with_draft(scenario, build_latency(scenario, base_dir))
    stepper = SimulatedStepper(parts.scheduler, parts.kv, latency, tokenizer,
                               build_speculation(scenario), parts.links)
    max_len = scenario.scheduler.max_model_len or scenario.model_spec.max_context_tokens
    return SimulatedBackend(stepper, budget, max_len, latency.name)
