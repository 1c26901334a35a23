"""The request factory: a validated `WorkloadConfig` in, a lazy seeded `Request` stream out.

Arrivals and each length draw from their own child generator of one
`SeedSequence`, so editing one distribution never shifts the others' draws;
adding `shared_prefix` keeps arrivals and output lengths draw for draw and
only lengthens the prompts that open with a system prompt. The config models
live in `sim.config.workload` (the scenario schema) and are re-exported here.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.config.workload import ConversationsConfig, SharedPrefixConfig, TraceConfig, WorkloadConfig
from sim.core.request import Request
from sim.workload.arrivals import DEFAULT_CHUNK_SIZE, ArrivalProcess, arrival_chunks_s
from sim.workload.build import (
    arrival_process,
    conversation_spec,
    length_spec,
    load_trace,
    resolve_trace_path,
    shared_prefix_spec,
)
from sim.workload.lengths import LengthSpec, sample_lengths
from sim.workload.prefixes import IdSource, SharedPrefix, shared_prompt

if TYPE_CHECKING:  # a trace's and a conversation's modules load when one is asked for
    from sim.workload.prompt_groups import PromptGroups
    from sim.workload.trace import Trace

__all__ = [
    "ConversationsConfig",
    "SharedPrefixConfig",
    "TraceConfig",
    "WorkloadConfig",
    "length_spec",
    "load_trace",
    "make_requests",
    "resolve_trace_path",
]


def _synthetic(
    process: ArrivalProcess,
    prompt_spec: LengthSpec,
    output_spec: LengthSpec,
    prefix: SharedPrefix | None,
    seed: int,
    limit: float,
    end_s: float,
    chunk_size: int,
) -> Iterator[Request]:
    """Independent requests; with `prefix`, child stream 3 picks who opens with which prompt."""
    arrivals_rng, prompt_rng, output_rng, prefix_rng = (
        np.random.default_rng(child) for child in np.random.SeedSequence(seed).spawn(4)
    )
    ids = IdSource(prefix.num_reserved_ids if prefix is not None else 0)
    # equal lengths share one int object, so a request owns none of its lengths' memory:
    # two ints (~50 B) are a fifth of a waiting request's, and an overloaded queue holds
    # most of a run's requests
    shared: dict[int, int] = {}

    def lengths(spec: LengthSpec, rng: np.random.Generator) -> list[int]:
        return [shared.setdefault(n, n) for n in sample_lengths(spec, rng, chunk_size).tolist()]

    request_id = 0
    for times_s in arrival_chunks_s(process, arrivals_rng, chunk_size):
        prompts = lengths(prompt_spec, prompt_rng)
        outputs = lengths(output_spec, output_rng)
        choices = (
            prefix.draw_choices(prefix_rng, chunk_size).tolist()
            if prefix is not None
            else [-1] * chunk_size
        )
        for arrival_s, prompt, output, choice in zip(
            times_s.tolist(), prompts, outputs, choices, strict=True
        ):
            if request_id >= limit or arrival_s >= end_s:
                return
            if prefix is None:
                yield Request(request_id, arrival_s, prompt, output)
            else:
                tokens, block_ids, _ = shared_prompt(prefix, choice, prompt, ids)
                yield Request(
                    request_id,
                    arrival_s,
                    tokens,
                    output,
                    prefix_block_ids=block_ids,
                    prefix_unit_tokens=prefix.unit_tokens,
                )
            request_id += 1


def _grouped(
    process: ArrivalProcess,
    prompt_spec: LengthSpec,
    output_spec: LengthSpec,
    groups: PromptGroups,
    seed: int,
    limit: float,
    end_s: float,
    chunk_size: int,
) -> Iterator[Request]:
    """Prompts of `groups` in a cycle; arrivals and lengths draw from the same child streams as
    an independent workload's, so only the prompts' content and repeats differ."""
    arrivals_rng, prompt_rng, output_rng, _ = (
        np.random.default_rng(child) for child in np.random.SeedSequence(seed).spawn(4)
    )
    from sim.workload.prompt_groups import PromptCycle

    cycle = PromptCycle(groups)
    request_id = 0
    for times_s in arrival_chunks_s(process, arrivals_rng, chunk_size):
        prompts = sample_lengths(prompt_spec, prompt_rng, chunk_size).tolist()
        outputs = sample_lengths(output_spec, output_rng, chunk_size).tolist()
        for arrival_s, drawn, output in zip(times_s.tolist(), prompts, outputs, strict=True):
            if request_id >= limit or arrival_s >= end_s:
                return
            tokens, block_ids = cycle.prompt(request_id, drawn)
            yield Request(request_id, arrival_s, tokens, output, prefix_block_ids=block_ids,
                          prefix_unit_tokens=groups.unit_tokens)
            request_id += 1


def _replay(trace: Trace, times_s: Iterator[float], limit: float, end_s: float
            ) -> Iterator[Request]:
    """Request i is trace row i; Mooncake rows keep their hash_ids exactly as given."""
    from sim.workload.trace import MOONCAKE_UNIT_TOKENS

    hashes = trace.prefix_block_ids
    rows = zip(times_s, trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), strict=False)
    for request_id, (arrival_s, prompt, output) in enumerate(rows):
        if request_id >= limit or arrival_s >= end_s:
            return
        if hashes is None:
            yield Request(request_id, arrival_s, prompt, output)
        else:
            yield Request(
                request_id,
                arrival_s,
                prompt,
                output,
                prefix_block_ids=hashes[request_id],
                prefix_unit_tokens=MOONCAKE_UNIT_TOKENS,
            )


def make_requests(
    cfg: WorkloadConfig,
    seed: int,
    base_dir: Path | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[Request]:
    """Requests in arrival order, ids 0, 1, 2, ...; lazy, so memory stays flat.

    Files are read eagerly (a missing trace fails here, not mid-run); requests lazily.
    Arrivals stop before `duration_s` (an arrival at exactly `duration_s` is excluded).
    A trace whose hash_ids disagree with ceil(input_length / 512) is replayed as
    given, with a warning counting the rows.
    """
    limit = cfg.num_requests if cfg.num_requests is not None else math.inf
    end_s = cfg.duration_s if cfg.duration_s is not None else math.inf
    if cfg.trace is not None:
        from sim.workload.text import TextTrace, check_fill, text_requests
        from sim.workload.trace import MOONCAKE_UNIT_TOKENS, replay_times_s

        columns = cfg.trace.columns.mapping() if cfg.trace.columns is not None else None
        trace = load_trace(
            cfg.trace.path, cfg.trace.format, cfg.trace.time_scale, base_dir, cfg.tokenizer,
            columns,
        )
        fill_arrivals = arrival_process(cfg.arrivals) if cfg.arrivals is not None else None
        fill_output = (
            length_spec(cfg.output_tokens, "output", base_dir, cfg.tokenizer)
            if cfg.output_tokens is not None
            else None
        )
        check_fill(trace, fill_arrivals, fill_output)
        if isinstance(trace, TextTrace):
            return text_requests(trace, fill_arrivals, fill_output, seed, limit, end_s, chunk_size)
        if trace.num_prefix_mismatched:
            warnings.warn(
                f"{trace.source}: {trace.num_prefix_mismatched} rows carry a number of "
                f"hash_ids other than ceil(input_length / {MOONCAKE_UNIT_TOKENS}); "
                "replaying them as given",
                stacklevel=2,
            )
        return _replay(trace, replay_times_s(trace, fill_arrivals, seed, chunk_size), limit, end_s)
    if cfg.arrivals is None or cfg.prompt_tokens is None or cfg.output_tokens is None:
        raise ValueError("a synthetic workload needs arrivals, prompt_tokens and output_tokens")
    process = arrival_process(cfg.arrivals)
    if cfg.conversations is not None:
        from sim.workload.conversations import conversation_turns

        spec = conversation_spec(cfg, base_dir)
        turns = conversation_turns(spec, process, seed, limit, end_s, chunk_size)
        return (turn.request for turn in turns)
    if cfg.prompt_groups is not None:
        from sim.workload.prompt_groups import PromptGroups

        pg = cfg.prompt_groups
        return _grouped(
            process,
            length_spec(cfg.prompt_tokens, "prompt", base_dir, cfg.tokenizer),
            length_spec(cfg.output_tokens, "output", base_dir, cfg.tokenizer),
            PromptGroups(pg.groups, pg.prompts_per_group, pg.system_tokens, cfg.unit_tokens),
            seed, limit, end_s, chunk_size,
        )
    return _synthetic(
        process,
        length_spec(cfg.prompt_tokens, "prompt", base_dir, cfg.tokenizer),
        length_spec(cfg.output_tokens, "output", base_dir, cfg.tokenizer),
        shared_prefix_spec(cfg),
        seed,
        limit,
        end_s,
        chunk_size,
    )
