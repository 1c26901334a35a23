"""Engine kernels against their floors: decode vs memory bandwidth, prefill vs matmul rate.

    python benchmarks/bench_engine.py --device cpu            # tiny and llama-100m
    python benchmarks/bench_engine.py --device cuda --out DIR # Llama-3-8B shape, bf16

Floors are measured on the same device, not taken from a datasheet: the copy
bandwidth of a large tensor (bytes read + written per second) and the rate of
a large square matmul in the engine's dtype. A decode step must read every
weight and the batch's KV once, so (weights + KV bytes) / bandwidth is its
floor; the table reports measured / floor (1.0 = at the floor). Prefill
tokens/s is turned into FLOP/s with sim.config.costs' FLOP count and compared with
the matmul rate. Steps run through the engine's own runner (CUDA graphs for
decode on CUDA) on synthetic block tables; KV contents do not affect timing.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from gpu_engine.kv_cache import PagedKVCache
from gpu_engine.runner import ModelRunner
from gpu_engine.weights import build_model
from sim.config.catalogue import get_model
from sim.config.costs import flops_per_token, kv_bytes_per_token, weights_bytes
from sim.config.specs import ModelSpec


def _timed(device: torch.device, fn, repeats: int) -> float:  # noqa: ANN001
    """Median seconds of `fn()` after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth_bytes_per_s(device: torch.device, size_bytes: int) -> float:
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _timed(device, lambda: dst.copy_(src), 10)
    return 2 * size_bytes / seconds


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = _timed(device, lambda: a @ b, 10)
    return 2 * n**3 / seconds


class Bench:
    """One model on one device with a KV pool for `max_tokens` tokens."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
                 max_tokens: int, max_seqs: int, block_size: int = 16) -> None:
        self.spec, self.device, self.block_size = spec, device, block_size
        num_blocks = max_tokens // block_size + max_seqs + 1
        self.model = build_model(spec, device, dtype, seed=0)
        self.kv = PagedKVCache.for_spec(spec, num_blocks, block_size, dtype, device)
        self.runner = ModelRunner(self.model, self.kv, device, max_seqs,
                                  -(-spec.max_context_tokens // block_size), cuda_graphs=True)

    def _tables(self, batch: int, tokens: int) -> tuple[tuple[int, ...], ...]:
        per_seq = -(-tokens // self.block_size)
        return tuple(tuple(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch))

    def step_s(self, batch: int, new_tokens: int, context: int, repeats: int) -> float:
        tables = self._tables(batch, context + new_tokens)
        inputs = self.runner.prepare([[1] * new_tokens] * batch, (context,) * batch, tables,
                                     (True,) * batch)

        def run() -> None:
            self.runner.execute(inputs, lambda logits: logits.argmax(-1))

        return _timed(self.device, run, repeats)


def bench_device(spec_names: list[str], device: torch.device, dtype: torch.dtype,
                 decode_batches: list[int], context: int, prefill_tokens: list[int],
                 repeats: int) -> dict:
    itemsize = torch.empty((), dtype=dtype).element_size()
    bandwidth = copy_bandwidth_bytes_per_s(device, 2**30 if device.type == "cuda" else 2**28)
    matmul = matmul_flops_per_s(device, dtype, 8192 if device.type == "cuda" else 1024)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda"
           else platform.processor() or platform.machine(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": str(dtype),
           "copy_bandwidth_GBps": bandwidth / 1e9, "matmul_TFLOPs": matmul / 1e12, "models": []}
    for name in spec_names:
        spec = get_model(name)
        bench = Bench(spec, device, dtype, max(max(decode_batches) * (context + 1),
                                               max(prefill_tokens)), max(decode_batches))
        w_bytes = weights_bytes(spec, dtype_bytes=itemsize)
        rows = []
        for batch in decode_batches:
            seconds = bench.step_s(batch, 1, context, repeats)
            kv_bytes = batch * context * kv_bytes_per_token(spec, dtype_bytes=itemsize)
            floor_s = (w_bytes + kv_bytes) / bandwidth
            rows.append({"kind": "decode", "batch": batch, "context": context,
                         "step_ms": seconds * 1e3, "floor_ms": floor_s * 1e3,
                         "floor_over_measured": floor_s / seconds,
                         "tokens_per_s": batch / seconds})
        for tokens in prefill_tokens:
            seconds = bench.step_s(1, tokens, 0, max(3, repeats // 4))
            flops = sum(flops_per_token(spec, c) for c in range(0, tokens, 64)) * 64
            rows.append({"kind": "prefill", "batch": 1, "tokens": tokens,
                         "step_ms": seconds * 1e3, "tokens_per_s": tokens / seconds,
                         "achieved_TFLOPs": flops / seconds / 1e12,
                         "share_of_matmul_rate": flops / seconds / matmul})
        out["models"].append({"model": name, "params": spec.total_params,
                              "weights_GiB": w_bytes / 2**30, "rows": rows})
        del bench
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def print_table(result: dict) -> None:
    print(f"device {result['device']}, torch {result['torch']}, cuda {result['cuda']}, "
          f"{result['dtype']}: copy {result['copy_bandwidth_GBps']:.1f} GB/s, "
          f"matmul {result['matmul_TFLOPs']:.2f} TFLOP/s")
    for m in result["models"]:
        print(f"\n{m['model']} ({m['params'] / 1e6:.0f}M params, {m['weights_GiB']:.2f} GiB)")
        print("| kind | batch | tokens/ctx | step ms | tokens/s | floor ms | floor/measured |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in m["rows"]:
            size = r.get("context", r.get("tokens"))
            floor = f"{r['floor_ms']:.3f}" if "floor_ms" in r else "-"
            share = r.get("floor_over_measured", r.get("share_of_matmul_rate"))
            print(f"| {r['kind']} | {r['batch']} | {size} | {r['step_ms']:.3f} | "
                  f"{r['tokens_per_s']:.0f} | {floor} | {share:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", help="write results.json here")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.device == "cuda":
        result = bench_device(["llama-3-8b"], torch.device("cuda"), torch.bfloat16,
                              [1, 8, 64, 256], 1024, [512, 1024, 2048, 4096, 8192],
                              args.repeats)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        result = bench_device(["tiny", "llama-100m"], torch.device("cpu"), torch.float32,
                              [1, 8, 32], 256, [128, 512], args.repeats)
    print_table(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_engine.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
