"""Runs the model on one step's inputs and times it: eager, or a CUDA graph for decode.

Decode steps launch hundreds of small kernels whose launch cost dominates at
small batches, so on CUDA a decode-only step replays a graph captured for its
batch bucket. The batch bucket is the plan's own `padded_batch` (the scheduler
pads with `sim.core.batching`, so the simulator prices the same rows); the rows
past the real batch are padding that writes only the null block. The attention
kernel reads block tables in place from the runner's persistent
`BlockTableStore`, so a graph depends on the batch bucket alone. Every graph
is captured by `warmup` / `capture_all`, before anything is timed; a decode
step that finds its graph missing is an error, never a capture inside a
timed step. The graph computes logits for every row, and the step's emitting
rows are picked from them afterwards (`logits_indices`), so nothing depends
on where in the batch a non-emitting row sits. Prefill and mixed steps run
eagerly; on the CPU everything is eager.

Inside a step the host never waits on the device but once: `execute`'s one
transfer of the sampled tokens. Inputs go over in one pinned non-blocking
copy (gpu_engine/staging.py), a graph's static inputs are refreshed by one
device-to-device copy, and attention needs no host-side read of any tensor.

Device time: CUDA events around the kernels on CUDA, the monotonic clock on CPU
(where the kernels run synchronously), so it excludes scheduling and input
preparation; the engine measures the whole step around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gpu_engine.attention import attention_backend
from gpu_engine.block_tables import BlockTableStore
from gpu_engine.inputs import StepInputs, build_inputs
from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.model import LlamaModel
from sim.core.batching import graph_batch_sizes

_TILE_ROWS = 64  # query rows (tokens x grouped heads) per attention tile of a chunk


@dataclass(frozen=True, slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: StepInputs  # static buffers the graph reads
    logits: torch.Tensor  # static buffer the graph writes: every row's logits


class ModelRunner:
    """`max_blocks_per_seq` bounds a block table (max_model_len / block_size, rounded up)."""

    def __init__(self, model: LlamaModel, kv: PagedKVCache, device: torch.device,
                 max_num_seqs: int, max_blocks_per_seq: int, cuda_graphs: bool = True,
                 backend: str | None = None) -> None:
        self.model = model
        self.kv = kv
        self.device = device
        self.max_blocks_per_seq = max_blocks_per_seq
        self.backend = backend or attention_backend(device, model.spec.sliding_window)
        self.use_graphs = cuda_graphs and device.type == "cuda" and self.backend == "triton"
        self.graph_sizes = graph_batch_sizes(max_num_seqs)
        spec = model.spec
        self.tile_tokens = max(1, _TILE_ROWS // (spec.num_heads // spec.num_kv_heads))
        self.tables = (BlockTableStore(2 * max_num_seqs + 1, max_blocks_per_seq, device)
                       if self.backend == "triton" else None)
        self._graphs: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    # -- inputs ----------------------------------------------------------------
    def prepare(self, new_token_ids: list[list[int]], context_tokens: Sequence[int],
                block_tables: Sequence[Sequence[int]], emits_token: Sequence[bool],
                min_seqs: int = 0, seq_ids: Sequence[int] | None = None,
                logits_rows: Sequence[int] | None = None) -> StepInputs:
        """Tensors for a step of `min_seqs` rows (the plan's padded_batch: dummy rows for
        static batching's finished members and for CUDA-graph buckets, which the scheduler
        chose with sim.core.batching; the runner never pads on its own).

        `seq_ids` (request ids) keep each sequence's block table in the persistent
        store, updated by deltas; a graph replay needs them. `logits_rows`: see
        `build_inputs`.
        """
        num_seqs = len(new_token_ids)
        pad_seqs = max(min_seqs, num_seqs)
        return build_inputs(new_token_ids, context_tokens, block_tables, emits_token,
                            self.kv.block_size, self.device,
                            pad_seqs_to=pad_seqs if pad_seqs > num_seqs else None,
                            backend=self.backend,
                            store=self.tables if seq_ids is not None else None,
                            seq_ids=seq_ids, logits_rows=logits_rows,
                            tile_tokens=self.tile_tokens)

    # -- execution -------------------------------------------------------------
    def execute(self, inputs: StepInputs,
                sample: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list[int], float]:
        """Run the model and `sample` on its logits; returns (token ids, device seconds).

        The `tolist()` here is the step's one host-device synchronisation.
        """
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

    def uses_graph(self, inputs: StepInputs) -> bool:
        """Whether `inputs` replays a captured graph (a decode step over the store's tables)."""
        return (self.use_graphs and inputs.is_decode_only and inputs.num_seqs in self.graph_sizes
                and self.tables is not None and inputs.block_tables is self.tables.table)

    @torch.inference_mode()
    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        if self.uses_graph(inputs):
            return self._replay(inputs)
        return self.model(inputs, self.kv)

    def _replay(self, inputs: StepInputs) -> torch.Tensor:
        entry = self._graphs.get(inputs.num_seqs)
        if entry is None:
            raise RuntimeError(f"no CUDA graph for a decode batch of {inputs.num_seqs}: "
                               "capture_all() (or warmup()) before serving, so that no "
                               "capture lands inside a timed step")
        size = inputs.graph_bytes
        if size != entry.inputs.graph_bytes:
            raise RuntimeError(f"decode inputs of {size} bytes for a graph captured over "
                               f"{entry.inputs.graph_bytes}")
        entry.inputs.packed[:size].copy_(inputs.packed[:size], non_blocking=True)
        entry.graph.replay()
        return entry.logits.index_select(0, inputs.logits_indices)

    def _static_inputs(self, batch: int) -> StepInputs:
        """Decode inputs of `batch` null-block rows whose buffers a graph is captured over."""
        return build_inputs([[0]] * batch, [0] * batch, [()] * batch, [True] * batch,
                            self.kv.block_size, self.device, backend=self.backend,
                            store=self.tables, seq_ids=[None] * batch,  # type: ignore[list-item]
                            tile_tokens=self.tile_tokens)

    def _capture(self, batch: int) -> _Graph:
        """Capture the decode graph for a batch bucket on null-block inputs."""
        static = self._static_inputs(batch)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # compile kernels and warm the allocator outside the graph
                self.model(static, self.kv)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool), torch.inference_mode():
            logits = self.model(static, self.kv)
        entry = _Graph(graph, static, logits)
        self._graphs[batch] = entry
        return entry

    def capture_all(self) -> int:
        """Capture every batch bucket (largest first, so smaller ones share its pool); returns
        how many graphs there are."""
        if self.use_graphs:
            for size in reversed(self.graph_sizes):
                if size not in self._graphs:
                    self._capture(size)
            torch.cuda.synchronize()
        return len(self._graphs)

    def warmup(self, prefill_tokens: int = 32) -> None:
        """Run each kind of step on the null block (a prefill, a chunk on a context among
        decodes, a decode batch) so first-step costs are not timed, then capture the graphs."""
        bs = self.kv.block_size
        decodes = min(8, self.graph_sizes[-1])
        shapes = ([[0] * prefill_tokens], [[0] * 8] + [[0]] * 2, [[0]] * decodes)
        contexts = ((0,), (bs,) + (1,) * 2, (1,) * decodes)
        for shape, context in zip(shapes, contexts, strict=True):
            inputs = self.prepare(shape, context, ((),) * len(shape), (True,) * len(shape))
            with torch.inference_mode():
                self._forward(inputs)
        self.capture_all()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
