"""Decode steps for Nsight Compute to count the attention kernel's DRAM bytes.

    ncu --clock-control none -k regex:attention_kernel --launch-skip 6 --launch-count 1 \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum python3 -m calibrate.gpu.traffic

Eager decode steps (no graphs, so each kernel is its own launch) of Llama-3-8B's
attention shape, 2 layers, batch 64 at 2k context over random KV; it prints the
live K+V bytes one layer's attention must read. The kernel reads in place when
ncu's bytes read are about that (plus queries and outputs, under 1%), where a
dense gather would read it and write a copy first.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.runner import ModelRunner
from gpu_engine.weights import build_model
from sim.config.catalogue import get_model
from sim.config.costs import kv_bytes_per_token

BLOCK = 16


def main(batch: int = 64, context: int = 2048, steps: int = 4) -> int:
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    spec = dataclasses.replace(get_model("llama-3-8b"), num_layers=2)
    model = build_model(spec, device, torch.bfloat16, seed=0)
    per_seq = -(-(context + 1) // BLOCK)
    kv = PagedKVCache.for_spec(spec, batch * per_seq + 1, BLOCK, torch.bfloat16, device)
    for t in (*kv.k, *kv.v):
        t.normal_()
    runner = ModelRunner(model, kv, device, batch, per_seq, cuda_graphs=False)
    tables = [tuple(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    for _ in range(steps):
        inputs = runner.prepare([[1]] * batch, [context] * batch, tables, [True] * batch,
                                seq_ids=list(range(batch)))
        runner.execute(inputs, lambda x: x.argmax(-1))
    live = batch * (context + 1) * kv_bytes_per_token(spec, 2) / spec.num_layers
    print(f"live K+V bytes of one layer's decode attention: {live:.0f} "
          f"({live / 2**20:.1f} MiB), batch {batch} x context {context}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
