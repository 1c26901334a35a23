"""A step reads the device once (its sampled tokens) and copies only live KV blocks.

On a CPU nothing syncs, so the host reads that *would* make a GPU step wait are
counted by patching them: `.item()`, `.tolist()`, `int()`/`float()`/`bool()` of a
tensor, a tensor used as an index, `.cpu()` and every CUDA synchronize. Every
engine step (prefills, chunks, decodes, mixed, sampled, speculative with prompt
lookup or a draft model) must make exactly one: the transfer of its tokens.

What a decode step allocates is seen by a dispatch mode that records every
operator's output: the K/V read is exactly the live blocks, however uneven the
batch, where a dense gather would pad every row to the widest.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from calibrate.gpu.sync_count import patched_reads  # noqa: E402
from gpu_engine.inputs import build_inputs  # noqa: E402
from gpu_engine.kv_cache import PagedKVCache  # noqa: E402
from gpu_engine.sampling import SamplingParams  # noqa: E402
from gpu_engine.setup import build_engine  # noqa: E402
from gpu_engine.weights import build_model  # noqa: E402
from sim.assemble import build_latency  # noqa: E402
from sim.config.catalogue import get_model  # noqa: E402
from sim.config.scenario import Scenario  # noqa: E402
from sim.core.request import Request  # noqa: E402

CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}
def _scenario(k: int = 0, draft: str | dict = "ngram", policy: str = "continuous") -> Scenario:
    return Scenario.model_validate({
        "name": "sync-test", "seed": 3, "model": "tiny", "hardware": {"gpu": CPU_HW},
        "scheduler": {"policy": policy, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                      **({"batch_size": 3} if policy == "static" else {})},
        "kv": {"num_blocks": 200, "block_size": 8},
        "engine": {"device": "cpu", "warmup": False},
        "speculative": {"num_tokens": k, "draft": draft},
        "workload": {"arrivals": {"process": "poisson", "rate": 100.0},
                     "prompt_tokens": {"dist": "uniform", "low": 4, "high": 90},
                     "output_tokens": {"dist": "uniform", "low": 2, "high": 12},
                     "num_requests": 6},
    })


@pytest.mark.parametrize("case", ["greedy", "sampled", "ngram", "draft-model", "static"])
def test_every_step_reads_the_device_exactly_once(case: str) -> None:
    scenario = {"ngram": _scenario(3), "static": _scenario(policy="static"),
                "draft-model": _scenario(2, draft={"base": "tiny", "num_layers": 1})
                }.get(case, _scenario())
    engine = build_engine(scenario, latency=build_latency(scenario)).engine
    sampled = case in ("sampled", "ngram", "draft-model")
    for i in range(6):
        params = SamplingParams(temperature=0.9, top_k=20, top_p=0.9) \
            if sampled and i % 2 else SamplingParams()
        engine.add_request(Request(i, 0.0, 10 + 15 * i, 4 + i), params, now=0.0)
    kinds = set()
    while True:
        with patched_reads() as counts:
            outcome = engine.step()
        if outcome is None:
            assert not counts
            break
        plan, _ = outcome
        assert dict(counts) == {"tolist": 1}, (plan.shape, dict(counts))
        shape = plan.shape
        kinds.add((bool(shape.prefill_chunk_tokens), bool(shape.num_decodes),
                   bool(shape.num_spec_tokens)))
    assert (True, True, False) in kinds or case != "greedy"  # a mixed step was among them
    assert any(spec for _, _, spec in kinds) == (case in ("ngram", "draft-model"))


class _Outputs(TorchDispatchMode):
    """Every operator's output bytes, and those of the reads of `caches` (by identity)."""

    def __init__(self, caches: list) -> None:
        super().__init__()
        self.caches = {t.data_ptr() for t in caches}
        self.total_bytes = 0
        self.cache_read_bytes = 0
        self.largest_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, tuple | list) else (out,)
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        size = sum(o.numel() * o.element_size() for o in outputs if isinstance(o, torch.Tensor)
                   and o.untyped_storage().data_ptr() not in inputs)  # views, in-place: none
        self.total_bytes += size
        self.largest_bytes = max(self.largest_bytes, size)
        if args and isinstance(args[0], torch.Tensor) and args[0].data_ptr() in self.caches:
            self.cache_read_bytes += size
        return out


def test_a_decode_step_copies_only_the_live_blocks() -> None:
    """Eight decodes, one at a long context: the K/V copied is what they hold, not 8 x 26."""
    spec = get_model("tiny")
    block, contexts = 8, [200] + [3] * 7
    model = build_model(spec, "cpu", torch.float32, seed=0)
    kv = PagedKVCache.for_spec(spec, 64, block, torch.float32, "cpu")
    tables, taken = [], 1
    for ctx in contexts:
        count = -(-(ctx + 1) // block)
        tables.append(tuple(range(taken, taken + count)))
        taken += count
    inputs = build_inputs([[1]] * 8, contexts, tables, [True] * 8, block, "cpu")
    spy = _Outputs(kv.k + kv.v)
    with torch.inference_mode(), spy:
        model(inputs, kv)
    block_bytes = block * spec.num_kv_heads * spec.head_dim * 4
    live_blocks = sum(len(t) for t in tables)  # 26 + 7
    assert spy.cache_read_bytes == 2 * spec.num_layers * live_blocks * block_bytes
    dense = 2 * spec.num_layers * len(contexts) * max(map(len, tables)) * block_bytes
    assert spy.total_bytes < dense  # the whole step allocates less than a dense gather alone
