"""Runs the model on one step's inputs and times it: eager, or a CUDA graph for decode.

Decode steps launch hundreds of small kernels whose launch cost dominates at
small batches, so on CUDA a decode-only step replays a graph captured for its
batch bucket and block-table width bucket. The batch bucket is the plan's own
`padded_batch` (the scheduler pads with `sim.core.batching`, so the simulator
prices the same rows); the rows past the real batch are padding that writes
only the null block. Prefill and mixed steps run eagerly. On the CPU everything is eager.

Device time: CUDA events around the kernels on CUDA, the monotonic clock on CPU
(where the kernels run synchronously), so it excludes scheduling and input
preparation; the engine measures the whole step around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from gpu_engine.inputs import StepInputs, build_inputs
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import LlamaModel
from sim.core.batching import graph_batch_sizes

_TENSOR_FIELDS = tuple(f.name for f in fields(StepInputs)
                       if f.name not in ("num_seqs", "max_query_len", "max_seq_len",
                                         "is_decode_only"))
_MIN_GRAPH_BLOCKS = 16


@dataclass(frozen=True, slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: StepInputs  # static buffers the graph reads
    logits: torch.Tensor  # static buffer the graph writes


def block_width_bucket(num_blocks: int, max_blocks: int) -> int:
    """Block-table width a decode graph is captured for: a power of two, at most max_blocks."""
    width = _MIN_GRAPH_BLOCKS
    while width < num_blocks:
        width *= 2
    return max(num_blocks, min(width, max_blocks))


class ModelRunner:
    """`max_blocks_per_seq` bounds a block table (max_model_len / block_size, rounded up)."""

    def __init__(self, model: LlamaModel, kv: PagedKVCache, device: torch.device,
                 max_num_seqs: int, max_blocks_per_seq: int, cuda_graphs: bool = True) -> None:
        self.model = model
        self.kv = kv
        self.device = device
        self.max_blocks_per_seq = max_blocks_per_seq
        self.use_graphs = cuda_graphs and device.type == "cuda"
        self.graph_sizes = graph_batch_sizes(max_num_seqs)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    # -- inputs ----------------------------------------------------------------
    def prepare(self, new_token_ids: list[list[int]], context_tokens: tuple[int, ...],
                block_tables: tuple[tuple[int, ...], ...], emits_token: tuple[bool, ...],
                min_seqs: int = 0) -> StepInputs:
        """Tensors for a step of `min_seqs` rows (the plan's padded_batch: dummy rows for
        static batching's finished members and for CUDA-graph buckets, which the scheduler
        chose with sim.core.batching); a step that can replay a graph gets its block-table
        width bucketed too.
        """
        num_seqs = len(new_token_ids)
        pad_seqs = max(min_seqs, num_seqs)
        pad_blocks = None
        if self.use_graphs and all(len(t) == 1 for t in new_token_ids) and \
                pad_seqs in self.graph_sizes:
            widest = max(len(b) for b in block_tables)
            pad_blocks = block_width_bucket(widest, self.max_blocks_per_seq)
        return build_inputs(new_token_ids, context_tokens, block_tables, emits_token,
                            self.kv.block_size, self.device,
                            pad_seqs_to=pad_seqs if pad_seqs > num_seqs else None,
                            pad_blocks_to=pad_blocks)

    # -- execution -------------------------------------------------------------
    def execute(self, inputs: StepInputs,
                sample: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list[int], float]:
        """Run the model and `sample` on its logits; returns (token ids, device seconds)."""
        if self.device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            tokens = sample(self._forward(inputs))
            end.record()
            token_ids = tokens.tolist()  # synchronises
            return token_ids, start.elapsed_time(end) / 1e3
        started = time.perf_counter()
        token_ids = sample(self._forward(inputs)).tolist()
        return token_ids, time.perf_counter() - started

    @torch.inference_mode()
    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        width = inputs.block_tables.shape[1]
        if self.use_graphs and inputs.is_decode_only and inputs.num_seqs in self.graph_sizes \
                and width == block_width_bucket(width, self.max_blocks_per_seq):
            return self._replay(inputs)
        return self.model(inputs, self.kv)

    def _replay(self, inputs: StepInputs) -> torch.Tensor:
        key = (inputs.num_seqs, inputs.block_tables.shape[1])
        entry = self._graphs.get(key) or self._capture(inputs)
        for name in _TENSOR_FIELDS:
            if name != "logits_indices":  # the graph computes every row's logits
                getattr(entry.inputs, name).copy_(getattr(inputs, name), non_blocking=True)
        entry.graph.replay()
        return entry.logits[:inputs.logits_indices.shape[0]]

    def _capture(self, inputs: StepInputs) -> _Graph:
        """Capture the decode graph for `inputs`' shape on null-block inputs."""
        num_seqs, width = inputs.num_seqs, inputs.block_tables.shape[1]
        dummy = build_inputs([[0]] * num_seqs, [0] * num_seqs, [()] * num_seqs,
                             [True] * num_seqs, self.kv.block_size, self.device,
                             pad_blocks_to=width)
        static = StepInputs(**{f.name: getattr(dummy, f.name) for f in fields(StepInputs)}
                            | {"max_seq_len": width * self.kv.block_size})
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels and allocator outside the graph
                self.model(static, self.kv)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.model(static, self.kv)
        entry = _Graph(graph, static, logits)
        self._graphs[(num_seqs, width)] = entry
        return entry

    def warmup(self, prefill_tokens: int = 32) -> None:
        """Run prefill and decode shapes on the null block so first-step costs are not timed."""
        for shape in ([[0] * prefill_tokens], [[0]] * min(8, self.graph_sizes[-1])):
            inputs = self.prepare(shape, (0,) * len(shape), ((),) * len(shape),
                                  (True,) * len(shape))
            with torch.inference_mode():
                self._forward(inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def capture_all(self, block_widths: tuple[int, ...] = (_MIN_GRAPH_BLOCKS,)) -> int:
        """Capture every batch bucket (largest first, so smaller ones share its pool)."""
        if not self.use_graphs:
            return 0
        for width in block_widths:
            null_table = (0,) * width  # the null block: capture reads and writes nothing real
            for size in reversed(self.graph_sizes):
                inputs = self.prepare([[0]] * size, (0,) * size, (null_table,) * size,
                                      (True,) * size)
                key = (inputs.num_seqs, inputs.block_tables.shape[1])
                if key not in self._graphs:
                    self._capture(inputs)
        return len(self._graphs)
