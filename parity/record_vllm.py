"""Record vLLM's own v1 Scheduler on every parity configuration (run with the vLLM venv's python).

    VENV/bin/python -m parity.record_vllm [--async] [--out FILE] [--only NAME ...]

The real `vllm.v1.core.sched.scheduler.Scheduler` runs on CPU with no weights
and no GPU: a ModelConfig on parity/tiny_llama (a config.json only, no
tokenizer, offline), a KV cache config of N blocks with no tensors, and a
fabricated ModelRunnerOutput per step that gives one token (parity.configs.
output_token_id) to each request whose computed tokens reached its known
tokens. The step loop and the record are parity.steps'; servesim is never
imported. The output file's metadata names the vLLM version that produced it.

`--async` records vLLM's AsyncScheduler instead (`async_scheduling=True`), driven
as its engine core drives it (parity.steps.run_config_async: step n + 1 scheduled
while step n runs), on the configurations whose settings vLLM accepts with async
scheduling (parity.configs.runs_async); it writes vllm-VERSION-async.jsonl.gz.
Drafts then are vLLM's own placeholders: its engine hands the scheduler no draft
tokens under async scheduling (EngineCore.post_step).

Works on vLLM 0.32 and 0.34: the fabricated ModelRunnerOutput passes
`req_id_to_index` only where the class still has that field (0.34 dropped it and
indexes by `req_ids`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import sys
import time
import warnings
from collections import deque
from pathlib import Path
from types import SimpleNamespace

from parity.configs import (
    GENERATOR_VERSION,
    ParityConfig,
    RequestSpec,
    accepted_drafts,
    generate_configs,
    output_token_id,
    runs_async,
)
from parity.parallel import FAMILY as PARALLEL_FAMILY
from parity.parallel import ParentSpec, child_label, generate_parallel_configs
from parity.steps import RunResult, Scheduled, run_config, run_config_async
from parity.trace import write_trace

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE / "tiny_llama"


def default_out(version: str, async_scheduling: bool = False, parallel: bool = False) -> Path:
    tail = ("-parallel-sampling" if parallel else "") + ("-async" if async_scheduling else "")
    return HERE / "traces" / f"vllm-{version}{tail}.jsonl.gz"


class VllmSide:
    """parity.steps.Side over one vLLM Scheduler (AsyncScheduler with `async_scheduling`)
    built for `config`."""

    def __init__(self, config: ParityConfig, v: _Vllm, async_scheduling: bool = False) -> None:
        self.v = v
        self.async_scheduling = async_scheduling
        model = v.ModelConfig(model=str(MODEL_DIR), skip_tokenizer_init=True,
                              max_model_len=config.max_model_len, dtype="float32")
        sched = v.SchedulerConfig(max_num_seqs=config.max_num_seqs,
                                  max_num_batched_tokens=config.max_num_batched_tokens,
                                  max_model_len=config.max_model_len, is_encoder_decoder=False,
                                  enable_chunked_prefill=config.chunked_prefill,
                                  async_scheduling=async_scheduling,
                                  watermark=config.watermark)
        cache = v.CacheConfig(block_size=config.block_size,
                              enable_prefix_caching=config.prefix_caching)
        cache.num_gpu_blocks = config.num_blocks
        extra = {}
        if config.speculative_tokens:
            kw: dict = {"method": config.speculative_method,
                        "num_speculative_tokens": config.speculative_tokens}
            if config.speculative_method == "ngram":
                kw.update(prompt_lookup_max=3, prompt_lookup_min=1)
            else:  # a draft model needs only its config too
                kw.update(model=str(MODEL_DIR), target_model_config=model,
                          target_parallel_config=v.ParallelConfig())
            extra["speculative_config"] = v.SpeculativeConfig(**kw)
        vllm_config = v.VllmConfig(model_config=model, scheduler_config=sched,
                                   cache_config=cache, device_config=v.DeviceConfig(device="cpu"),
                                   **extra)
        _check_effective(vllm_config, config, async_scheduling)
        spec = v.FullAttentionSpec(block_size=config.block_size, num_kv_heads=2, head_size=16,
                                   dtype=v.torch.float32)
        kv_config = v.KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[v.KVCacheGroupSpec(["layers.0"], spec)])
        cls = v.AsyncScheduler if async_scheduling else v.Scheduler
        self.sched = cls(vllm_config, kv_config, v.StructuredOutputManager(vllm_config),
                         block_size=config.block_size)
        self.hasher = v.get_request_block_hasher(config.block_size, v.sha256)
        self.k = config.speculative_tokens
        self.requests: dict[str, object] = {}
        self.labels: dict[str, int] = {}  # vLLM's request id -> the integer the record names
        self._out = None
        # async: (output, ids that emit) of each step scheduled and not yet applied, oldest first
        self._outs: deque[tuple[object, frozenset[str]]] = deque()

    def add(self, spec: RequestSpec) -> None:
        v = self.v
        n = spec.n if isinstance(spec, ParentSpec) else 1
        params = v.SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True, n=n)
        children = [(str(spec.request_id), params, spec.request_id)]
        if n > 1:  # as vLLM's frontend (AsyncLLM.add_request): its ParentRequest names the
            # children and their params, which are added one after another, same instant
            parent = v.ParentRequest(SimpleNamespace(
                request_id=str(spec.request_id), external_req_id=str(spec.request_id),
                params=params))
            children = [(*parent.get_child_info(i), child_label(spec.request_id, i))
                        for i in range(n)]
        elif isinstance(spec, ParentSpec):
            children = [(str(spec.request_id), params, child_label(spec.request_id, 0))]
        for rid, child_params, label in children:
            req = v.Request(rid, list(spec.prompt_token_ids), child_params, None,
                            arrival_time=float(spec.arrival_step), block_hasher=self.hasher)
            self.requests[rid] = req
            self.labels[rid] = label
            self.sched.add_request(req)

    def schedule(self) -> Scheduled:
        running = {r.request_id for r in self.sched.running}
        out = self._out = self.sched.schedule()
        scheduled = tuple((self.labels[rid], n) for rid, n in out.num_scheduled_tokens.items())
        admitted = tuple((self.labels[rid], self.requests[rid].num_computed_tokens - n)
                         for rid, n in out.num_scheduled_tokens.items() if rid not in running)
        preempted = tuple(self.labels[rid] for rid in out.preempted_req_ids)
        free = self.sched.kv_cache_manager.block_pool.get_num_free_blocks()
        spec = out.scheduled_spec_decode_tokens
        drafts = tuple((self.labels[rid], len(spec[rid])) for rid in out.num_scheduled_tokens
                       if spec.get(rid))
        if self.async_scheduling:  # a step emits for a request it leaves past its prefill
            self._outs.append((out, frozenset(rid for rid in out.num_scheduled_tokens
                                              if not self.requests[rid].is_prefill_chunk)))
        return Scheduled(scheduled, preempted, admitted, free, drafts)

    def step_done(self) -> list[int]:
        if self.async_scheduling:
            out, emitting = self._outs.popleft()
        else:
            out, self._out, emitting = self._out, None, None
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.requests[rid]
            # computed was advanced at schedule time: caught up = emits 1 + accepted drafts
            emits = req.num_computed_tokens >= req.num_tokens if emitting is None \
                else rid in emitting
            done = len(req.output_token_ids)
            label = self.labels[rid]
            count = 1 + accepted_drafts(label, done, len(out.scheduled_spec_decode_tokens
                                                         .get(rid, ())))
            sampled.append([output_token_id(label, done + j) for j in range(count)]
                           if emits else [])
        index = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} \
            if self.v.runner_output_has_index else {}
        mro = self.v.ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **index)
        results = self.sched.update_from_output(out, mro)
        finished = [self.labels[o.request_id] for outs in results.values()
                    for o in outs.outputs if o.finish_reason is not None]
        # the drafter proposes k tokens for every request that ran (synchronous engine only:
        # under async scheduling the scheduler keeps its own placeholders)
        if self.k and not self.async_scheduling:
            live = [rid for rid in ids if self.labels[rid] not in finished]
            drafts = [[output_token_id(self.labels[rid] + 7919,
                                       len(self.requests[rid].output_token_ids) + j)
                       for j in range(self.k)] for rid in live]
            self.sched.update_draft_token_ids(self.v.DraftTokenIds(live, drafts))
        return finished

    def has_unfinished(self) -> bool:
        return self.sched.get_num_unfinished_requests() > 0


def _check_effective(vllm_config, config: ParityConfig, async_scheduling: bool) -> None:
    """vLLM may adjust settings in its post-init; a silent change would fake a mismatch."""
    s, c = vllm_config.scheduler_config, vllm_config.cache_config
    got = (s.max_num_seqs, s.max_num_batched_tokens, s.enable_chunked_prefill,
           c.enable_prefix_caching, s.watermark, vllm_config.model_config.max_model_len,
           vllm_config.num_speculative_tokens,
           s.max_num_scheduled_tokens or s.max_num_batched_tokens, bool(s.async_scheduling))
    want = (config.max_num_seqs, config.max_num_batched_tokens, config.chunked_prefill,
            config.prefix_caching, config.watermark, config.max_model_len,
            config.speculative_tokens, config.max_num_batched_tokens, async_scheduling)
    if got != want:
        raise RuntimeError(f"{config.name}: vLLM changed the settings {want} to {got}")


class _Vllm:
    """vLLM's classes, imported once (the import takes seconds)."""

    def __init__(self) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        # pinned: the V2 runner needs Triton (absent on CPU) and changes no decision here
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        warnings.filterwarnings("ignore", message="Unable to find acceptable character")
        import torch
        import vllm
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            SpeculativeConfig,
            VllmConfig,
        )
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.engine.parallel_sampling import ParentRequest
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        init_none_hash(sha256)
        # config sanity warnings (e.g. a budget above max_num_seqs * max_model_len) are noise here
        logging.getLogger("vllm").setLevel(logging.ERROR)
        self.torch, self.version = torch, vllm.__version__
        self.CacheConfig, self.DeviceConfig, self.ModelConfig = CacheConfig, DeviceConfig, \
            ModelConfig
        self.SchedulerConfig, self.VllmConfig = SchedulerConfig, VllmConfig
        self.SamplingParams, self.sha256 = SamplingParams, sha256
        self.get_request_block_hasher, self.Scheduler = get_request_block_hasher, Scheduler
        self.FullAttentionSpec, self.KVCacheConfig = FullAttentionSpec, KVCacheConfig
        self.KVCacheGroupSpec, self.ModelRunnerOutput = KVCacheGroupSpec, ModelRunnerOutput
        self.Request, self.StructuredOutputManager = Request, StructuredOutputManager
        self.ParallelConfig, self.SpeculativeConfig = ParallelConfig, SpeculativeConfig
        self.DraftTokenIds, self.AsyncScheduler = DraftTokenIds, AsyncScheduler
        self.ParentRequest = ParentRequest
        # vLLM 0.34 dropped ModelRunnerOutput.req_id_to_index (rows follow req_ids)
        self.runner_output_has_index = "req_id_to_index" in {
            f.name for f in dataclasses.fields(ModelRunnerOutput)}
        defaults = SchedulerConfig.default_factory()
        self.defaults = {"scheduler_reserve_full_isl": defaults.scheduler_reserve_full_isl,
                         "watermark": defaults.watermark, "policy": defaults.policy,
                         "long_prefill_token_threshold": defaults.long_prefill_token_threshold}


def record(configs: list[ParityConfig], progress: bool = True, async_scheduling: bool = False
           ) -> tuple[dict, list[RunResult]]:
    t0 = time.perf_counter()
    v = _Vllm()
    import_s = time.perf_counter() - t0
    runs = []
    if async_scheduling:
        configs = [c for c in configs if runs_async(c)]
    run = run_config_async if async_scheduling else run_config
    bar = _progress(len(configs), progress)
    t1 = time.perf_counter()
    for config in configs:
        runs.append(run(config, VllmSide(config, v, async_scheduling)))
        bar(config.name)
    run_s = time.perf_counter() - t1
    steps = sum(len(r.steps) for r in runs)
    meta = {"scheduler": "vllm", "vllm_version": v.version, "torch_version": v.torch.__version__,
            "python": platform.python_version(), "generator_version": GENERATOR_VERSION,
            "num_configs": len(runs), "num_steps": steps, "block_hasher": "sha256",
            "async_scheduling": async_scheduling, "vllm_scheduler_defaults": v.defaults}
    if async_scheduling:
        meta["batch_queue"] = 2
    mode = " (async scheduling)" if async_scheduling else ""
    print(f"vLLM {v.version}{mode}: import {import_s:.1f} s; {len(runs)} configurations, {steps} "
          f"steps in {run_s:.1f} s ({1e3 * run_s / max(1, len(runs)):.1f} ms per configuration, "
          f"{steps / max(run_s, 1e-9):.0f} steps/s); "
          f"{sum(r.error is not None for r in runs)} with errors", file=sys.stderr)
    return meta, runs


def _progress(total: int, enabled: bool):
    if not enabled:
        return lambda name: None
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda name: None
    bar = tqdm(total=total, unit="config", file=sys.stderr)

    def tick(name: str) -> None:
        bar.set_postfix_str(name)
        bar.update()
        if bar.n == total:
            bar.close()
    return tick


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="trace file (default parity/traces/vllm-VERSION"
                    ".jsonl.gz)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="record these configurations")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--async", dest="async_scheduling", action="store_true",
                    help="record vLLM's AsyncScheduler (default out: vllm-VERSION-async.jsonl.gz)")
    ap.add_argument("--parallel-sampling", action="store_true",
                    help="record the n > 1 configurations of parity/parallel.py (default out: "
                    "vllm-VERSION-parallel-sampling[-async].jsonl.gz)")
    args = ap.parse_args(argv)
    configs = generate_parallel_configs() if args.parallel_sampling else generate_configs()
    if args.only:
        known = {c.name for c in configs}
        unknown = [n for n in args.only if n not in known]
        if unknown:
            print(f"--only: unknown configuration {unknown[0]!r}; names look like "
                  f"'mixed-000' (see parity/configs.py FAMILIES)", file=sys.stderr)
            return 2
        configs = [c for c in configs if c.name in args.only]
    meta, runs = record(configs, progress=not args.no_progress,
                        async_scheduling=args.async_scheduling)
    if args.parallel_sampling:
        meta["configs"] = PARALLEL_FAMILY
    out = args.out or default_out(meta["vllm_version"], args.async_scheduling,
                                  args.parallel_sampling)
    write_trace(out, meta, runs)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
