"""Policy name -> how to build its scheduler and which KV pools it runs on.

Why a registry: the scenario loader validates `scheduler.policy` and `kv.mode`
against it and sim.assemble builds from it, so adding a policy touches one place.
Settings arrive as one plain value (no pydantic here: sim.core stays bare).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from sim.core.contiguous import ContiguousAllocator
from sim.core.kv import KVManager
from sim.core.schedulers.base import Scheduler
from sim.core.schedulers.continuous import ContinuousScheduler
from sim.core.schedulers.dynamic import DEFAULT_MAX_WAIT_S, DynamicScheduler
from sim.core.schedulers.speculation import async_scheduling_problem
from sim.core.schedulers.static import StaticScheduler


class SchedulerSettings(NamedTuple):
    """Every policy's knobs; each policy reads the ones it has.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    max_model_len: int | None = None
    max_output_tokens: int | None = None
    batch_size: int = 16
    max_wait_s: float | None = None  # dynamic: None = DEFAULT_MAX_WAIT_S; static: no timer
    preemption: str = "recompute"  # continuous: "recompute" or "swap"
    speculative_tokens: int = 0  # continuous: k drafts per decoding sequence per step
    speculative_method: str = "ngram"  # continuous: "ngram" or "draft_model" (speculation.py)
    cuda_graphs: bool = False  # continuous: pad decode-only steps to CUDA-graph batch sizes
    scheduler_reserve_full_isl: bool = True  # continuous: vLLM's full-sequence admission check
    # continuous: vLLM's async scheduling (resolve_async_scheduling turns a scenario's
    # true / false / None into this)
    async_scheduling: bool = False


class Policy(NamedTuple):
    """`kv_modes`: the KV pools the policy runs on, its default first.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    build: Callable[[KVManager, SchedulerSettings], Scheduler]
    kv_modes: tuple[str, ...]


def _continuous(kv: KVManager, s: SchedulerSettings) -> Scheduler:
    return ContinuousScheduler(kv, s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill,
                               s.max_model_len, max_output_tokens=s.max_output_tokens,
                               preemption=s.preemption, speculative_tokens=s.speculative_tokens,
                               speculative_method=s.speculative_method,
                               scheduler_reserve_full_isl=s.scheduler_reserve_full_isl,
                               cuda_graphs=s.cuda_graphs, async_scheduling=s.async_scheduling)


def resolve_async_scheduling(requested: bool | None, policy: str, preemption: str,
                             speculative_tokens: int, speculative_method: str) -> bool:
    """A scenario's `scheduler.async_scheduling` as the scheduler runs it.

    None (the default) is vLLM's default: on for the continuous policy unless its
    settings run synchronously (n-gram speculative decoding, which vLLM 0.32's
    VllmConfig refuses under async scheduling; servesim's swap preemption), off for
    request-level batching. An explicit true those settings refuse is an error.
    """
    problem = None
    if policy != "continuous":
        problem = f"policy {policy!r} has no async mode (request-level batching)"
    else:
        problem = async_scheduling_problem(preemption, speculative_tokens, speculative_method)
    if requested is None:
        return problem is None
    if requested and problem is not None:
        raise ValueError(f"scheduler.async_scheduling: true is not allowed here: {problem}; "
                         "set it false, or omit it (then it is on where vLLM would run "
                         "asynchronously)")
    return requested


def _request_level(kv: KVManager, s: SchedulerSettings) -> ContiguousAllocator:
    """The contiguous pool request-level batching needs; it never speculates."""
    if s.speculative_tokens:
        raise ValueError(f"speculative decoding needs continuous batching, got "
                         f"speculative_tokens={s.speculative_tokens} for request-level batching")
    return _contiguous(kv)


def _contiguous(kv: KVManager) -> ContiguousAllocator:
    if not isinstance(kv, ContiguousAllocator):
        raise TypeError(f"request-level batching needs a contiguous KV pool, "
                        f"got {type(kv).__name__}")
    return kv


def _static(kv: KVManager, s: SchedulerSettings) -> Scheduler:
    return StaticScheduler(_request_level(kv, s), s.batch_size, s.max_wait_s, s.max_model_len,
                           s.max_output_tokens)


def _dynamic(kv: KVManager, s: SchedulerSettings) -> Scheduler:
    wait_s = DEFAULT_MAX_WAIT_S if s.max_wait_s is None else s.max_wait_s
    return DynamicScheduler(_request_level(kv, s), s.batch_size, wait_s, s.max_model_len,
                            s.max_output_tokens)


POLICIES: Mapping[str, Policy] = MappingProxyType({
    "continuous": Policy(_continuous, ("paged", "contiguous")),
    "static": Policy(_static, ("contiguous",)),
    "dynamic": Policy(_dynamic, ("contiguous",)),
})


def build_scheduler(policy: str, kv: KVManager, settings: SchedulerSettings) -> Scheduler:
    try:
        entry = POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown scheduler policy {policy!r}; "
                         f"known: {', '.join(POLICIES)}") from None
    return entry.build(kv, settings)
