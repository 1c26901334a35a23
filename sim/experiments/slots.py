"""The same requests under several batching policies with the same number of slots.

`servesim plot slots` shows who occupies which slot at each step, padded and
empty slots included: the one-picture explanation of continuous batching.
This module runs those small simulations (a SlotRecorder observing each);
sim.plots.slots draws them.
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import numpy as np

from sim.assemble import (
    build_block_manager,
    build_latency,
    build_scheduler,
    kv_budget,
    replica_links,
)
from sim.config.scenario import Scenario
from sim.observe.slots import SlotRecorder
from sim.results.record.recorder import RunRecorder
from sim.workload import make_requests
from sim.world.fleet import simulate

MAX_STEPS = 10_000  # what a picture draws at most per policy: a column per step


def record_slots(scenario: Scenario, policy: str, slots: int = 8, num_requests: int = 40,
                 max_steps: int | None = None, burst: bool = True,
                 mean_output_tokens: float = 20.0, base_dir: Path | None = None
                 ) -> SlotRecorder:
    """Simulate the scenario's first `num_requests` requests under `policy` with `slots`
    batch slots (static/dynamic batch_size, continuous max_num_seqs).

    `max_steps`: the steps recorded; None records until every request has finished (at
    most MAX_STEPS), so that no policy's panel is cut short of its last request.

    `burst` makes them all arrive at 0, a backlog that shows how each policy refills
    its slots; `mean_output_tokens` > 0 scales the output lengths to that mean, keeping
    their spread, so that a few hundred steps show several batches (0: as drawn).
    """
    cfg = scenario.scheduler.model_copy(update={
        "policy": policy, "batch_size": slots, "max_num_seqs": slots,
        "max_num_batched_tokens": max(slots, scenario.scheduler.max_num_batched_tokens),
        **({} if policy == "continuous" else {"preemption": "recompute"})})
    kv = scenario.kv.model_copy(update={"mode": None, **(
        {} if policy == "continuous" else {"prefix_caching": False})})
    one = scenario.model_copy(update={"scheduler": cfg, "kv": kv, "replicas": 1})
    requests = list(islice(make_requests(one.workload, one.seed, base_dir), num_requests))
    scale = 0.0
    if mean_output_tokens > 0 and requests:
        scale = mean_output_tokens / float(np.mean([r.output_tokens for r in requests]))
    requests = [r.rescripted(0.0 if burst else r.arrival_s, max(
        1, round(r.output_tokens * scale)) if scale else r.output_tokens) for r in requests]
    pool = build_block_manager(one, kv_budget(one))
    recorder = SlotRecorder(MAX_STEPS if max_steps is None else max_steps)
    simulate(requests, build_scheduler(one, pool), build_latency(one, base_dir), RunRecorder(),
             observer=recorder, links=replica_links(one))
    return recorder
