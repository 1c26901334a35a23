"""Does vLLM's Scheduler take fabricated drafts and acceptance counts on CPU? (issue 14, item 4)

    VENV/bin/python -m parity.probe_spec

Two requests, k = 3 drafts each per decode, through vLLM's real Scheduler, once
with no speculative config and once with SpeculativeConfig(method="ngram"),
which needs no draft model. Drafts go in through update_draft_token_ids();
acceptance is a fabricated sampled_token_ids row of 1 + accepted tokens. It
prints, per step, what was scheduled, the drafts, and the computed and output
counts, so the rollback of rejected drafts can be read off.
"""

from __future__ import annotations

import logging
import os
import warnings

from parity.record_vllm import MODEL_DIR

K = 3
ACCEPTED = (1, 3, 0, 2, 3, 1, 0, 2)  # per step, capped by the drafts scheduled


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    warnings.filterwarnings("ignore", message="Unable to find acceptable character")
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    logging.getLogger("vllm").setLevel(logging.ERROR)
    init_none_hash(sha256)
    for speculative in (False, True):
        model = ModelConfig(model=str(MODEL_DIR), skip_tokenizer_init=True, max_model_len=2048,
                            dtype="float32")
        sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=2048,
                                is_encoder_decoder=False, async_scheduling=False)
        cache = CacheConfig(block_size=16, enable_prefix_caching=True)
        cache.num_gpu_blocks = 64
        extra = {"speculative_config": SpeculativeConfig(
            method="ngram", num_speculative_tokens=K, prompt_lookup_max=3,
            prompt_lookup_min=1)} if speculative else {}
        config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                            device_config=DeviceConfig(device="cpu"), **extra)
        spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16,
                                 dtype=torch.float32)
        kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
        s = Scheduler(config, kv, StructuredOutputManager(config), block_size=16)
        hasher = get_request_block_hasher(16, sha256)
        for i in range(2):
            s.add_request(Request(str(i), list(range(1 + i, 30 + i)),
                                  SamplingParams(max_tokens=12, ignore_eos=True), None,
                                  block_hasher=hasher))
        print(f"speculative_config={'ngram' if speculative else None}, "
              f"num_speculative_tokens={config.num_speculative_tokens}")
        for step, accepted in enumerate(ACCEPTED):
            if not s.has_unfinished_requests():
                break
            out = s.schedule()
            ids = list(out.num_scheduled_tokens)
            sampled = []
            for rid in ids:
                drafts = out.scheduled_spec_decode_tokens.get(rid, [])
                caught_up = s.requests[rid].num_computed_tokens >= s.requests[rid].num_tokens
                sampled.append([5] * (1 + min(accepted, len(drafts))) if drafts
                               else [5] * caught_up)
            s.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled))
            live = [r for r in ids if r in s.requests and not s.requests[r].is_finished()]
            s.update_draft_token_ids(DraftTokenIds(live, [[9] * K for _ in live]))
            drafts = {r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()}
            state = {r: (s.requests[r].num_computed_tokens, len(s.requests[r].output_token_ids))
                     for r in live}
            print(f"  step {step}: scheduled {dict(out.num_scheduled_tokens)} drafts {drafts} "
                  f"accepted<= {accepted}; (computed, outputs) after: {state}")


if __name__ == "__main__":
    main()
