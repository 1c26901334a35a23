"""The GPU check's first two phases, correctness and speed (see calibrate/gpu/check.py).

Each returns its results as a dict; `speed` also files them into `results` as
each row is measured, so a stop or a failure keeps the rows taken.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import TYPE_CHECKING, Any

import torch

from calibrate.gpu import correct
from calibrate.gpu import speed as device_speed
from sim.config.catalogue import get_model

if TYPE_CHECKING:
    from calibrate.gpu.guard import Deadline, Plan

GIB = 2**30


def _free_device() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def correctness(plan: Plan, device: torch.device, dtype: torch.dtype, backend: str
                ) -> dict[str, Any]:
    spec = dataclasses.replace(get_model(plan.check_model), num_layers=2)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    errors = correct.attention_errors(device, dtype, backend, small=plan.smoke)
    out: dict[str, Any] = {"attention_backend": backend, "attention_rel_error": errors,
                           "attention_tolerance": tolerance,
                           "attention_ok": all(e <= tolerance for e in errors.values())}
    if backend == "triton":  # the torch backend too, as a second opinion
        out["torch_backend_rel_error"] = correct.attention_errors(device, dtype, "torch",
                                                                      small=plan.smoke)
    out["graph_vs_eager"] = correct.graph_vs_eager(spec, device, dtype)
    out["host_syncs_per_step"] = correct.step_syncs(spec, device, dtype)
    out["decode_allocation"] = correct.decode_allocation(
        get_model(plan.check_model), device, dtype, 8 if plan.smoke else 64,
        256 if plan.smoke else 2048)
    return out


def speed(plan: Plan, device: torch.device, dtype: torch.dtype, results: dict[str, Any],
          guard: Deadline) -> dict[str, Any]:
    floors = device_speed.measure_floors(device, dtype)
    results["floors"] = {"copy_GBps": floors.bandwidth_bytes_per_s / 1e9,
                         "matmul_TFLOPs": floors.matmul_flops_per_s / 1e12}
    spec = get_model(plan.speed_model)
    longest = max(plan.prefill_sizes + tuple(c + 1 for _, c in plan.decode_points))
    biggest = max(b * (c + 1) for b, c in plan.decode_points)
    bench = device_speed.Bench(spec, device, dtype, max(biggest, longest),
                               max(b for b, _ in plan.decode_points),
                               longest + device_speed.BLOCK)
    out: dict[str, Any] = {"model": spec.name, "kv_pool_GiB": bench.kv.bytes_total() / GIB,
                           "graphs": bench.runner.num_graphs, "rows": []}
    results["speed"] = out
    for point in plan.decode_points:
        guard.check()
        out["rows"] += device_speed.decode_rows(bench, floors, [point], plan.speed_repeats)
    for tokens in plan.prefill_sizes:
        guard.check()
        out["rows"] += device_speed.prefill_rows(bench, floors, [tokens],
                                              max(3, plan.speed_repeats // 2))
    out["targets"] = targets(out["rows"])
    model = bench.model
    del bench
    _free_device()
    if plan.generate is not None and (plan.smoke or guard.left_s() > 120):
        batch, prompt, output = plan.generate
        ours = device_speed.engine_generate_s(spec, device, dtype, batch, prompt, output, model)
        del model
        _free_device()
        out["generate"] = {"batch": batch, "prompt": prompt, "output": output,
                           "engine_s": ours, "transformers_s": None, "engine_speedup": None}
        try:
            theirs = device_speed.hf_generate_s(spec, device, dtype, batch, prompt, output)
        except Exception as err:  # noqa: BLE001 - the ratio is optional
            out["generate"]["transformers_error"] = f"{type(err).__name__}: {err}"
        else:
            out["generate"] |= {"transformers_s": theirs,
                                "engine_speedup": None if theirs is None else theirs / ours}
    return out


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's H200 targets, read off the measured rows (None where a row is missing)."""
    def row(kind: str, **keys: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["kind"] == kind
                     and all(r.get(k) == v for k, v in keys.items())), None)

    out: dict[str, Any] = {}
    b1 = row("decode", batch=1, context=512)
    if b1:
        share = b1["weights_floor_ms"] / b1["device_ms"]
        out["decode_b1_share_of_weight_floor"] = share
        out["decode_b1_ok"] = share >= 0.8 and b1["device_ms"] <= 4.7
    b64 = row("decode", batch=64, context=2048)
    if b64:
        out["decode_b64_2k_over_floor"] = b64["over_floor"]
        out["decode_b64_2k_ok"] = b64["over_floor"] <= 1.3
    p8k = row("prefill", tokens=8192)
    if p8k:
        out["prefill_8k_share_of_matmul"] = p8k["share_of_matmul_rate"]
        out["prefill_8k_ok"] = p8k["share_of_matmul_rate"] >= 0.6
    return out
