"""`servesim serve --engine`: the serving loop's Stepper on the real engine.

Each step runs the kernels and samples with the request's own parameters
(temperature, top-k, top-p, seed, penalties, logit bias), on a worker thread so the HTTP side keeps
answering while it runs; the loop touches the scheduler only between steps.
Output lengths stay scripted (max_tokens, as the simulator's), EOS included,
so the engine's plans are the ones a simulation of the same arrivals makes.

It lives in the CLI because it joins two parts that must not import each other: the
serving loop (sim.serve, which never imports torch or gpu_engine) and the engine
(gpu_engine, which stays below the server: the engine does not know it is served).
`servesim serve --engine` imports it only when it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_engine.engine import Engine
from gpu_engine.sampling import SamplingParams
from gpu_engine.setup import EngineSetupError, build_engine
from sim.config.scenario import Scenario
from sim.core.kv import KVBudget, KVManager
from sim.core.request import Request
from sim.core.schedulers.base import Scheduler
from sim.serve.api import Generation
from sim.serve.stepper import StepDone
from sim.text.base import Tokenizer


@dataclass(slots=True, eq=False)
class EngineStepper:
    """The loop's Stepper over an Engine on the wall clock."""

    engine: Engine
    scheduler: Scheduler
    kv: KVManager

    def clock(self) -> float:
        return self.engine.clock.now()

    def add(self, request: Request, generation: Generation, at_s: float) -> bool:
        seed = None if generation.seed is None else \
            (generation.seed + generation.child_index) % 2**64  # vLLM's seed + index per child
        sampling = SamplingParams(temperature=generation.temperature, top_k=generation.top_k,
                                  top_p=generation.top_p, seed=seed,
                                  presence_penalty=generation.presence_penalty,
                                  frequency_penalty=generation.frequency_penalty,
                                  repetition_penalty=generation.repetition_penalty,
                                  logit_bias=generation.logit_bias,
                                  logprobs=generation.logprobs)
        return self.engine.add_request(request, sampling, now=at_s)

    def abort(self, request_id: int, at_s: float) -> Request | None:
        return self.engine.abort(request_id, at_s)

    def refuses(self, generation: Generation) -> str | None:
        """A field this engine cannot honour for `generation`, else None: speculative
        verification samples without the penalties and the bias."""
        if self.engine.drafter is None:
            return None
        return next((name for name, on in (
            ("presence_penalty", generation.presence_penalty != 0),
            ("frequency_penalty", generation.frequency_penalty != 0),
            ("repetition_penalty", generation.repetition_penalty != 1),
            ("logit_bias", bool(generation.logit_bias)),
            ("logprobs", generation.logprobs is not None)) if on), None)

    async def step(self, start_s: float, admit_until: Callable[[float], None]
                   ) -> StepDone | None:
        engine = self.engine
        held = self.scheduler.kv_slots_held
        outcome = await asyncio.to_thread(engine.step, admit_until, start_s)
        events = engine.drain_events()
        if outcome is None:
            return None
        plan, finished = outcome
        log = engine.steps[-1]
        for request in finished:
            engine.release(request.request_id)
        engine.steps.clear()  # a server runs for long: keep no step log
        return StepDone(log.start_s, log.duration_s, plan, finished,
                        [(e.request_id, e.token_id) for e in events], held,
                        logprobs={e.request_id: e.logprobs for e in events
                                  if e.logprobs is not None} or None)


def build_engine_stepper(scenario: Scenario, tokenizer: Tokenizer, base_dir: Path | None = None
                         ) -> tuple[EngineStepper, KVBudget, int]:
    """The engine for the scenario (gpu_engine.setup) as a Stepper, its KV budget and context."""
    setup = build_engine(scenario, base_dir)
    spec = scenario.model_spec
    if tokenizer.vocab_size > spec.vocab_size:
        raise EngineSetupError(f"tokenizer: {tokenizer.name} has {tokenizer.vocab_size} token "
                               f"ids but {spec.name} has a vocabulary of {spec.vocab_size}")
    max_len = scenario.scheduler.max_model_len or spec.max_context_tokens
    return (EngineStepper(setup.engine, setup.replica.scheduler, setup.replica.kv),
            setup.budget, max_len)
