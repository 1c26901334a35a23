"""Engine kernels against their floors: decode vs memory bandwidth, prefill vs matmul rate.

    python benchmarks/bench_engine.py --device cpu            # tiny and llama-100m
    python benchmarks/bench_engine.py --device cuda --out DIR # Llama-3-8B shape, bf16

The measuring lives in calibrate/gpu/speed.py (the GPU check runs the same
code): floors measured on this device (copy bandwidth, a large matmul), steps
through the engine's own runner (CUDA graphs for decode on CUDA), random
weights and KV. Each row prints measured device time over its floor (1.0 = at
the floor).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from calibrate.gpu import speed as gpu_speed  # noqa: E402
from sim.config.catalogue import get_model  # noqa: E402
from sim.config.costs import weights_bytes  # noqa: E402
from sim.config.specs import stored_as  # noqa: E402


def bench_device(names: list[str], device: torch.device, dtype: torch.dtype,
                 decode: list[tuple[int, int]], prefill: list[int], repeats: int) -> dict:
    floors = gpu_speed.measure_floors(device, dtype)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda"
           else platform.processor() or platform.machine(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": str(dtype),
           "threads": torch.get_num_threads(),
           "copy_bandwidth_GBps": floors.bandwidth_bytes_per_s / 1e9,
           "matmul_TFLOPs": floors.matmul_flops_per_s / 1e12, "models": []}
    for name in names:
        spec = get_model(name)
        longest = max(prefill + [c + 1 for _, c in decode])
        bench = gpu_speed.Bench(spec, device, dtype, max(b * (c + 1) for b, c in decode),
                                max(b for b, _ in decode), longest + gpu_speed.BLOCK)
        rows = (gpu_speed.decode_rows(bench, floors, decode, repeats)
                + gpu_speed.prefill_rows(bench, floors, prefill, max(3, repeats // 4)))
        stored = stored_as(spec, str(dtype).removeprefix("torch."))
        out["models"].append({"model": name, "params": spec.total_params,
                              "weights_GiB": weights_bytes(stored) / 2**30,
                              "rows": rows})
        del bench
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def print_table(result: dict) -> None:
    print(f"device {result['device']}, torch {result['torch']}, cuda {result['cuda']}, "
          f"{result['dtype']}, {result['threads']} threads: copy "
          f"{result['copy_bandwidth_GBps']:.1f} GB/s, matmul {result['matmul_TFLOPs']:.3f} "
          "TFLOP/s")
    for m in result["models"]:
        print(f"\n{m['model']} ({m['params'] / 1e6:.0f}M params, {m['weights_GiB']:.2f} GiB)")
        print("| kind | batch | tokens/ctx | step ms | device ms | floor ms | device/floor |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in m["rows"]:
            size = r.get("context", r.get("tokens"))
            print(f"| {r['kind']} | {r['batch']} | {size} | {r['step_ms']:.3f} | "
                  f"{r['device_ms']:.3f} | {r['floor_ms']:.3f} | "
                  f"{r['device_ms'] / r['floor_ms']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", help="write bench_engine.json here")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="CPU torch threads")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.device == "cuda":
        points = [(b, c) for c in (512, 4096) for b in (1, 8, 64, 256)] + [(64, 2048)]
        result = bench_device(["llama-3-8b"], torch.device("cuda"), torch.bfloat16, points,
                              [512, 2048, 8192], args.repeats)
    else:
        torch.set_num_threads(args.threads)
        points = [(1, 256), (8, 256), (32, 256), (32, 64)]
        result = bench_device(["tiny", "llama-100m"], torch.device("cpu"), torch.float32,
                              points, [128, 512], args.repeats)
    print_table(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_engine.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
