"""The profiler's engine parts: one model, KV cache and runner, and a fresh scheduler per point.

Built from the same pieces as `gpu_engine.setup.build_engine` (model, paged
KV tensors, ModelRunner with CUDA graphs, the registry's continuous
scheduler), so the profiled engine is the engine a replay runs. The KV pool
is sized for the largest grid point that fits this device's memory.
"""

from __future__ import annotations

import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from calibrate.profile.grid import GridLimits, default_grid
from calibrate.profile.settings import ProfileSettings
from gpu_engine.devices import available_memory_bytes, resolve_device, resolve_dtype
from gpu_engine.engine import Engine
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import LlamaModel
from gpu_engine.runner import ModelRunner
from gpu_engine.weights import build_model
from sim.config.catalogue import get_model
from sim.config.costs import activation_reserve_bytes, kv_bytes_per_token
from sim.config.specs import ModelSpec, stored_as
from sim.core.kv import PagedBlockManager
from sim.core.schedulers import SchedulerSettings
from sim.core.schedulers import build_scheduler as build_policy
from sim.latency.table_format import TableMetadata

_HOST_SHARE = 0.25  # of free host memory the CPU profile's KV pool may take
_DEVICE_SHARE = 0.7  # of free GPU memory (after weights): decode gathers need the rest
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Rig:
    model: LlamaModel
    cache: PagedKVCache
    runner: ModelRunner
    spec: ModelSpec
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    pool_tokens: int
    settings: SchedulerSettings
    seed: int

    def fresh_engine(self, speculative_tokens: int = 0) -> Engine:
        """A new scheduler and block manager over the shared model, KV tensors and runner;
        `speculative_tokens` k > 0 drafts k tokens per decode (the engine needs a drafter)."""
        blocks = PagedBlockManager(self.cache.num_blocks, self.cache.block_size)
        settings = self.settings._replace(speculative_tokens=speculative_tokens)
        scheduler = build_policy("continuous", blocks, settings)
        return Engine(self.model, self.cache, scheduler, self.runner, seed=self.seed)


def git_commit() -> str:
    """This checkout's commit (`git rev-parse HEAD`); outside a git checkout (a copy of the
    tree on a GPU machine) the SERVESIM_COMMIT environment variable, else "unknown"."""
    fallback = os.environ.get("SERVESIM_COMMIT", "unknown")
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return fallback
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else fallback


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return "cpu"


def _pool_cap_tokens(spec: ModelSpec, settings: ProfileSettings, device: torch.device,
                     dtype: torch.dtype) -> int:
    stored = stored_as(spec, str(dtype).removeprefix("torch."))
    per_token = kv_bytes_per_token(stored)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        reserve = activation_reserve_bytes(stored, settings.max_num_batched_tokens,
                                           settings.max_num_seqs)
        return max(0, int((free * _DEVICE_SHARE - reserve) // per_token))
    return int(available_memory_bytes() * _HOST_SHARE // per_token)


def build_rig(settings: ProfileSettings) -> Rig:
    """Model (random weights), a KV pool for the grid, a warmed-up runner."""
    spec = get_model(settings.model)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    max_len = min(settings.max_model_len or spec.max_context_tokens, spec.max_context_tokens)
    model = build_model(spec, device, dtype, seed=settings.seed)
    unbounded = GridLimits(settings.max_num_batched_tokens, settings.max_num_seqs, max_len,
                           2**62, settings.steps_per_point)
    need = max(p.kv_tokens(settings.steps_per_point) for p in default_grid(unbounded))
    pool = min(need, _pool_cap_tokens(spec, settings, device, dtype))
    bs = settings.block_size
    blocks = math.ceil(pool / bs) + 1  # + the null block
    blocks += max(8, blocks // 50)  # the block manager's admission watermark
    cache = PagedKVCache.for_spec(spec, blocks, bs, dtype, device)
    runner = ModelRunner(model, cache, device, settings.max_num_seqs, math.ceil(max_len / bs),
                         settings.cuda_graphs)
    runner.warmup()
    scheduler = SchedulerSettings(max_num_seqs=settings.max_num_seqs,
                                  max_num_batched_tokens=settings.max_num_batched_tokens,
                                  chunked_prefill=True, max_model_len=max_len,
                                  cuda_graphs=runner.use_graphs)
    return Rig(model, cache, runner, spec, device, dtype, max_len, pool, scheduler,
               settings.seed)


def table_metadata(rig: Rig, settings: ProfileSettings, notes: str) -> TableMetadata:
    """What produced the table: device, versions, dtype, model, scheduler budgets, commit."""
    return TableMetadata(
        device_name=device_name(rig.device), device_kind=rig.device.type,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda if rig.device.type == "cuda" else None,
        dtype=str(rig.dtype).removeprefix("torch."), model_spec=rig.spec,
        block_size=settings.block_size, max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs, engine_commit=git_commit(), timing="wall",
        notes=notes)
