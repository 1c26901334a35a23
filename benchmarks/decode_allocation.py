"""What one decode step allocates and how long it takes, on an uneven batch (CPU).

    python benchmarks/decode_allocation.py [--model llama-100m] [--batch 32]

One sequence of the batch is long and the rest are short, which is where a
dense gather padded to the widest block table costs most. A dispatch mode
records every operator's output bytes (views and in-place writes excluded):
the bytes read out of the KV cache, and all bytes allocated. Only the
runner's `prepare` / `execute` are used, so the script runs unchanged against
older checkouts of the engine (the before/after figures of a change).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_engine.kv_cache import PagedKVCache  # noqa: E402
from gpu_engine.runner import ModelRunner  # noqa: E402
from gpu_engine.weights import build_model  # noqa: E402
from sim.config.catalogue import get_model  # noqa: E402

BLOCK = 16


class Allocations(TorchDispatchMode):
    def __init__(self, caches: list[torch.Tensor]) -> None:
        super().__init__()
        self.caches = {t.untyped_storage().data_ptr() for t in caches}
        self.total = self.from_cache = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        seen = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for o in out if isinstance(out, tuple | list) else (out,):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in seen:
                size = o.numel() * o.element_size()
                self.total += size
                if seen & self.caches:
                    self.from_cache += size
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-100m")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--long", type=int, default=2000, help="the long sequence's context")
    parser.add_argument("--short", type=int, default=100, help="the others' context")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = get_model(args.model)
    contexts = [args.long] + [args.short] * (args.batch - 1)
    tables, taken = [], 1
    for ctx in contexts:
        count = -(-(ctx + 1) // BLOCK)
        tables.append(tuple(range(taken, taken + count)))
        taken += count
    model = build_model(spec, "cpu", torch.float32, seed=0)
    kv = PagedKVCache.for_spec(spec, taken, BLOCK, torch.float32, "cpu")
    runner = ModelRunner(model, kv, torch.device("cpu"), args.batch,
                         -(-(args.long + 1) // BLOCK))
    new = [[1]] * args.batch

    def step() -> None:
        inputs = runner.prepare(new, tuple(contexts), tuple(tables), (True,) * args.batch)
        runner.execute(inputs, lambda logits: logits.argmax(-1))

    step()
    spy = Allocations(kv.k + kv.v)
    with torch.inference_mode(), spy:
        step()
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    live = sum(len(t) for t in tables) * BLOCK * spec.num_kv_heads * spec.head_dim * 4 * 2 \
        * spec.num_layers
    print(f"{spec.name}, batch {args.batch} (one at {args.long}, the rest at {args.short}): "
          f"read from the KV cache {spy.from_cache / 2**20:.2f} MiB "
          f"(live K+V {live / 2**20:.2f} MiB, ratio {spy.from_cache / live:.2f}); "
          f"allocated in all {spy.total / 2**20:.2f} MiB; "
          f"step {statistics.median(times) * 1e3:.2f} ms (median of {args.repeats})")


if __name__ == "__main__":
    main()
