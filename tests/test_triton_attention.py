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
from sim.assemble import build_latency  # noqa: E402
from sim.config.scenario import Scenario  # noqa: E402
from sim.core.request import Request  # noqa: E402

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


class _EagerGraph:
    """Stands in for a captured CUDA graph: replay runs the model on the static buffers."""

    def __init__(self, runner: ModelRunner, static, logits: torch.Tensor) -> None:  # noqa: ANN001
        self.runner, self.static, self.logits = runner, static, logits

    def replay(self) -> None:
        with torch.inference_mode():
            self.logits.copy_(self.runner.model(self.static, self.runner.kv))


def test_graph_replay_path_refreshes_static_buffers_and_picks_the_emitting_rows() -> None:
    """What a decode graph replay does, on the CPU: the step's packed inputs copied into the
    static buffers (same layout, the bucket's padding included), the graph's every-row
    logits narrowed to the emitting rows. Served this way, the engine emits the same."""
    from gpu_engine.runner import _Graph

    scenario = Scenario.model_validate({
        "name": "graph-path", "seed": 2, "model": "tiny", "hardware": {"gpu": CPU_HW},
        "scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 32},
        "kv": {"num_blocks": 64, "block_size": 4},
        # the scheduler pads decode steps to the graph batch sizes, as for a GPU
        "engine": {"device": "cpu", "warmup": False, "cuda_graphs": True},
        "workload": {"arrivals": {"process": "poisson", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 4},
                     "output_tokens": {"dist": "fixed", "value": 2}, "num_requests": 1}})
    engine = build_engine(scenario, latency=build_latency(scenario)).engine
    runner = ModelRunner(engine.model, engine.kv, torch.device("cpu"), 4, 16, backend="triton")
    runner.use_graphs = True  # as on CUDA; the graphs are stand-ins
    for size in runner.graph_sizes:
        static = runner._static_inputs(size)
        logits = torch.zeros(size, engine.model.spec.vocab_size)
        runner._graphs[size] = _Graph(_EagerGraph(runner, static, logits), static, logits)
    engine.runner = runner
    replays = []
    original = runner._replay
    runner._replay = lambda inputs: replays.append(inputs.num_seqs) or original(inputs)
    for i, (prompt, output) in enumerate([(9, 5), (30, 4), (3, 6)]):
        engine.add_request(Request(i, 0.0, prompt, output), now=0.0)
    for _ in engine.stream():
        pass
    assert replays and set(replays) <= set(runner.graph_sizes)
    assert 3 not in replays  # three decodes ran padded to the bucket of 4 (the plan's)
    assert {i: engine.output_ids(i) for i in range(3)} == _outputs("torch")
    # a decode step whose second row emits nothing: its logits are not the graph's row 1
    inputs = runner.prepare([[5], [6], [7]], [9, 3, 4], [(1, 2, 3), (4,), (5, 6)],
                            [True, False, True], min_seqs=4, seq_ids=[7, 8, 9])
    assert runner.uses_graph(inputs) and inputs.num_seqs == 4
    with torch.inference_mode():
        eager = engine.model(inputs, engine.kv)  # the LM head over the 2 emitting rows only
        graph = runner._forward(inputs)  # over all 4 rows, then the 2 picked
    assert graph.shape == eager.shape == (2, engine.model.spec.vocab_size)
    assert torch.allclose(graph, eager, atol=1e-5) and torch.equal(graph.argmax(-1),
                                                                   eager.argmax(-1))
    with pytest.raises(RuntimeError, match="capture_all"):
        runner._graphs.clear()
        runner._forward(inputs)
