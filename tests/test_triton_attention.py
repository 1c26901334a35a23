"""The Triton attention kernel against the fp64 reference, on the CPU through Triton's interpreter.

Triton's interpreter runs the kernel's own source on CPU tensors (numpy underneath), so
the paged indexing, the causal masks, grouped-query rows, split-KV and its combine are
checked here exactly as the CUDA build runs them. The interpreter must be switched on
before Triton is first imported, hence the environment variable at the top.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_engine_attention import _run_case  # noqa: E402

from gpu_engine.runner import ModelRunner  # noqa: E402
from gpu_engine.setup import build_engine  # noqa: E402
from sim.core.request import Request  # noqa: E402
from sim.run import build_latency  # noqa: E402
from sim.scenario import Scenario  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not triton.knobs.runtime.interpret,
                       reason="triton was imported before the interpreter was set"),
    # the interpreter's own numpy use (not ours)
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning"),
]


@settings(max_examples=25, deadline=None)
@given(seqs=st.lists(st.tuples(st.integers(0, 40), st.one_of(st.just(1), st.integers(1, 20))),
                     min_size=1, max_size=4),
       block_size=st.sampled_from([1, 4, 16]),
       heads=st.sampled_from([(4, 2), (4, 4), (6, 1), (2, 1)]),
       head_dim=st.sampled_from([4, 8]),
       pad_seqs=st.integers(0, 2), extra_blocks=st.integers(0, 2),
       splits=st.sampled_from([1, 2, 3]), data=st.data())
def test_kernel_equals_dense_reference(seqs, block_size, heads, head_dim, pad_seqs,
                                       extra_blocks, splits, data) -> None:
    emits = data.draw(st.lists(st.booleans(), min_size=len(seqs), max_size=len(seqs)))
    _run_case(random.Random(data.draw(st.integers(0, 2**31))), seqs, emits, block_size, *heads,
              head_dim, pad_seqs, extra_blocks, backend="triton", splits=splits)


@pytest.mark.parametrize("seqs", [
    [(33, 1), (5, 1), (16, 1), (0, 1)],  # decode only: the split-KV kernel + combine
    [(20, 9), (41, 1), (0, 12), (7, 1), (15, 1)],  # tiles of chunks and decodes + a fresh one
    [(70, 40), (3, 1)],  # a chunk spanning several tiles over a context of many blocks
])
def test_kernel_step_kinds(seqs) -> None:
    _run_case(random.Random(len(seqs)), seqs, [True] * len(seqs), 4, 8, 2, 8, pad_seqs=3,
              extra_blocks=1, backend="triton", splits=4)


CPU_HW = {"name": "cpu-test", "bf16_flops_per_s": 5e10, "memory_bytes": 2**26,
          "memory_bandwidth_bytes_per_s": 1e10, "interconnect_bandwidth_bytes_per_s": 1e9,
          "host_link_bandwidth_bytes_per_s": 1e9}


def _outputs(backend: str) -> dict[int, list[int]]:
    scenario = Scenario.model_validate({
        "name": "triton-engine", "seed": 2, "model": "tiny", "hardware": {"gpu": CPU_HW},
        "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 32},
        "kv": {"num_blocks": 64, "block_size": 4},
        "engine": {"device": "cpu", "warmup": False},
        "workload": {"arrivals": {"process": "poisson", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 4},
                     "output_tokens": {"dist": "fixed", "value": 2}, "num_requests": 1}})
    engine = build_engine(scenario, latency=build_latency(scenario)).engine
    engine.runner = ModelRunner(engine.model, engine.kv, torch.device("cpu"), 4, 16,
                                backend=backend)
    for i, (prompt, output) in enumerate([(9, 5), (30, 4), (3, 6)]):
        engine.add_request(Request(i, 0.0, prompt, output), now=0.0)
    for _ in engine.stream():
        pass
    assert engine.runner.tables is None or engine.runner.tables.num_rows == 9
    return {i: engine.output_ids(i) for i in range(3)}


def test_engine_on_the_kernel_emits_what_it_emits_on_torch() -> None:
    """Chunked prefill, mixed and decode steps through the persistent block tables."""
    assert _outputs("triton") == _outputs("torch")
