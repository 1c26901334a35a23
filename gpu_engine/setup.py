"""Build the real engine for a scenario, from the same assembly the simulator uses.

The KV pool's size, the block manager and the scheduler come from sim.assemble,
so an engine replay and a simulation of the same scenario get the same number
of blocks and the same scheduling code; only the step's duration differs
(measured here, predicted there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_engine.devices import (  # noqa: F401 - re-exported for callers of this module
    EngineSetupError,
    available_memory_bytes,
    resolve_device,
    resolve_dtype,
)
from gpu_engine.drafters import ModelDrafter, NgramDrafter
from gpu_engine.engine import Engine
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import refuse_unsupported
from gpu_engine.runner import ModelRunner
from gpu_engine.weights import build_model
from sim.assemble import ReplicaParts, build_replica, kv_budget
from sim.config.costs import weights_bytes
from sim.config.scenario import Scenario
from sim.config.specs import stored_as
from sim.core.kv import KVBudget
from sim.latency import LatencyModel


@dataclass(frozen=True, slots=True)
class EngineSetup:
    engine: Engine
    replica: ReplicaParts  # the block manager and scheduler sim.assemble built
    budget: KVBudget
    device: torch.device
    dtype: torch.dtype

    @property
    def description(self) -> str:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return f"engine({name}, {str(self.dtype).removeprefix('torch.')})"


def check_fits(scenario: Scenario, num_blocks: int, device: torch.device,
               dtype: torch.dtype) -> None:
    """Refuse, before allocating, a model or KV pool larger than this machine's memory."""
    spec = scenario.model_spec
    itemsize = torch.empty((), dtype=dtype).element_size()
    weights = weights_bytes(stored_as(spec, str(dtype).removeprefix("torch.")))
    kv = 2 * spec.num_layers * num_blocks * scenario.kv.block_size * spec.num_kv_heads * \
        spec.head_dim * itemsize
    need = weights + kv
    have = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else \
        available_memory_bytes()
    if need > 0.9 * have:
        raise EngineSetupError(
            f"model: {spec.name} needs {weights / 2**30:.1f} GiB of weights in "
            f"{str(dtype).removeprefix('torch.')} plus {kv / 2**30:.1f} GiB of KV cache "
            f"({num_blocks} blocks), but this {device.type} has {have / 2**30:.1f} GiB free; "
            "use a smaller model (e.g. model: tiny), fewer kv.num_blocks, or a GPU")


def build_drafter(scenario: Scenario, num_blocks: int, device: torch.device,
                  dtype: torch.dtype, seed: int) -> NgramDrafter | ModelDrafter | None:
    """Speculative decoding's proposer: prompt lookup, or a random-weight draft model."""
    spec = scenario.speculative
    if not spec.num_tokens:
        return None
    draft_spec = spec.draft_spec
    if draft_spec is None:
        return NgramDrafter()
    target = scenario.model_spec
    if draft_spec.vocab_size != target.vocab_size:
        raise EngineSetupError(f"speculative.draft: {draft_spec.name} has a vocabulary of "
                               f"{draft_spec.vocab_size}, {target.name} of {target.vocab_size}; "
                               "a draft must share the target's vocabulary")
    model = build_model(draft_spec, device, dtype, seed=seed + 1)
    kv = PagedKVCache.for_spec(draft_spec, num_blocks, scenario.kv.block_size, dtype, device)
    return ModelDrafter(model, kv, device)


def build_engine(scenario: Scenario, base_dir: Path | None = None,
                 latency: LatencyModel | None = None, device: str | None = None) -> EngineSetup:
    """The engine for one replica of `scenario`; `latency` set = virtual clock."""
    if scenario.replicas != 1:
        raise EngineSetupError(f"replicas: the engine serves one replica, got {scenario.replicas}"
                               "; set replicas: 1 (or simulate the fleet with `servesim run`)")
    if scenario.hardware.data_parallel > 1:
        raise EngineSetupError(f"hardware.data_parallel: the engine runs one attention rank, "
                               f"got {scenario.hardware.data_parallel}; simulate data-parallel "
                               "ranks with `servesim run`")
    if scenario.scheduler.preemption != "recompute":
        raise EngineSetupError(f"scheduler.preemption: the engine preempts by recompute only, "
                               f"got {scenario.scheduler.preemption!r}")
    spec = scenario.model_spec
    try:
        refuse_unsupported(spec)
    except ValueError as err:
        raise EngineSetupError(f"model: {err}") from None
    cfg = scenario.engine
    torch_device = resolve_device(device or cfg.device)
    dtype = resolve_dtype(cfg.dtype, torch_device)
    budget = kv_budget(scenario)
    try:
        replica = build_replica(scenario, budget, torch_device.type)
    except ValueError as err:
        raise EngineSetupError(str(err)) from None
    kv_manager = replica.kv
    check_fits(scenario, kv_manager.num_blocks, torch_device, dtype)
    if torch_device.type == "cpu" and cfg.cpu_threads is not None:
        torch.set_num_threads(cfg.cpu_threads)  # process-wide: the engine owns this process
    seed = scenario.seed if cfg.seed is None else cfg.seed
    weights_dir = None
    if cfg.weights is not None:
        weights_dir = Path(cfg.weights)
        if not weights_dir.is_absolute() and base_dir is not None:
            weights_dir = base_dir / weights_dir
        if not weights_dir.is_dir():
            raise EngineSetupError(f"engine.weights: {weights_dir} is not a directory")
    model = build_model(spec, torch_device, dtype, seed=seed, weights_dir=weights_dir)
    cache = PagedKVCache.for_spec(spec, kv_manager.num_blocks, scenario.kv.block_size, dtype,
                                  torch_device)
    max_len = scenario.scheduler.max_model_len or spec.max_context_tokens
    runner = ModelRunner(model, cache, torch_device, scenario.scheduler.max_num_seqs,
                         math.ceil(max_len / scenario.kv.block_size),
                         cfg.uses_cuda_graphs(torch_device.type))
    if cfg.warmup:
        runner.warmup()
    drafter = build_drafter(scenario, kv_manager.num_blocks, torch_device, dtype, seed)
    engine = Engine(model, cache, replica.scheduler, runner, seed=seed, latency=latency,
                    drafter=drafter)
    return EngineSetup(engine, replica, budget, torch_device, dtype)
