"""`servesim capacity`: the back-of-envelope sheet, every term shown with its numbers.

The numbers come from sim.config.capacity's pure `capacity_report` (a plain
dict), so the text sheet (sim.cli.capacity_sheet), the JSON and the tests all
read the same numbers. Long context ("how much bigger is
the KV cache than the weights at 128k?"): `--context 128k` (k = 1024 tokens,
the naming model cards use); the report gives one sequence's KV, the batch's
and the whole KV pool's, each against the weights, and notes a context past
the model's maximum.

Fit is stated, never implied by a zero: when weights and activations leave
no room for one sequence, the report says by how many GiB the GPU falls
short and the smallest tensor-parallel group that holds one sequence (and
the whole batch), and the command exits 1 so a script can tell.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from sim.config.catalogue import DEFAULT_MODEL  # plain Python, as is dtypes: the help text
from sim.config.dtypes import DTYPE_NAMES

if TYPE_CHECKING:  # loaded by the command, not by `servesim --help`
    from sim.config.hardware import HardwareSpec
    from sim.config.specs import ModelSpec

EXIT_DOES_NOT_FIT = 1


def _roofline_decode(model: ModelSpec, hw: HardwareSpec, tp: int, ep: int, r: dict[str, Any]
                     ) -> dict[str, Any]:
    """What the default latency model says one decode step of the sheet's batch takes."""
    from sim.config.frontend import Frontend
    from sim.core.plan import StepShape
    from sim.latency.roofline import RooflineLatency
    from sim.latency.roofline_fits import HOST_SERIAL_SHARE, family_of

    # as a scenario runs it by default: vLLM's async scheduling, the fitted serial share
    roofline = RooflineLatency(model, hw, tp=tp, ep=ep, host_serial_share=HOST_SERIAL_SHARE)
    batch, ctx = r["batch_size"], r["context_tokens"]
    shape = StepShape(num_decodes=batch, decode_context_sum=batch * ctx,
                      decode_context_max=ctx, padded_batch=batch)
    parts = roofline.breakdown(shape)
    gpu_s = sum(parts[k] for k in ("gemm_s", "small_s", "attention_s", "lm_head_s",
                                   "allreduce_s"))
    family, why = family_of(hw.name, hw.sm_count)
    frontend = Frontend()
    return {"roofline_decode_step_s": parts["total_s"], "roofline_cpu_s": parts["overhead_s"],
            "roofline_host_visible_s": parts["total_s"] - gpu_s,
            "roofline_output_lag_s": roofline.output_lag_s(shape),
            "roofline_family": family, "roofline_family_why": why,
            "frontend_api_server_s": frontend.api_server_s,
            "frontend_tokenize_s": frontend.tokenize_s_per_token * ctx,
            "frontend_token_out_s": (frontend.detokenize_s_per_token
                                     + frontend.stream_s_per_token),
            "frontend_offset_s": frontend.offset_s(ctx)}


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when not one sequence fits, 2 (one line on stderr) on bad
    input."""
    from sim.cli.capacity_args import context_tokens, load_model, number, positive_int
    from sim.cli.capacity_sheet import format_report
    from sim.config.capacity import capacity_report
    from sim.config.catalogue import get_hardware
    from sim.config.specs import check_ep, check_tp

    try:
        model = load_model(args)
        hw = get_hardware(args.gpu)
        tp = positive_int("--gpus", args.gpus)
        ep = positive_int("--ep", args.ep)
        try:
            check_tp(model, tp)
        except ValueError as err:
            raise ValueError(f"--gpus {tp}: {err}") from None
        dp = positive_int("--dp", args.dp)
        if dp > 1:
            return _data_parallel(args, model, hw, tp, ep, dp)
        try:
            check_ep(model, tp, ep)
        except ValueError as err:
            raise ValueError(f"--ep {ep}: {err}") from None
        report = capacity_report(
            model, hw,
            tp=tp,
            context_tokens=context_tokens(args.context),
            batch_size=positive_int("--batch", args.batch),
            memory_utilization=number(float, "--memory-utilization", args.memory_utilization,
                                       "a fraction in (0, 1]", lambda v: 0 < v <= 1),
            block_size=positive_int("--block-size", args.block_size),
            ep=ep,
        )
    except ValueError as err:
        print(f"servesim capacity: error: {err}", file=sys.stderr)
        return 2
    if report["fits"]:
        report = {**report, **_roofline_decode(model, hw, tp, ep, report)}
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["fits"] else EXIT_DOES_NOT_FIT


def _data_parallel(args: argparse.Namespace, model: ModelSpec, hw: HardwareSpec, gpus: int,
                   ep: int, dp: int) -> int:
    """`--dp N`: the DP/EP sheet (sim.config.capacity_dp), every term per GPU; exit 1 when
    a rank holds no sequence."""
    from sim.cli.capacity_args import context_tokens, number, positive_int
    from sim.cli.capacity_dp_sheet import format_dp_report
    from sim.config.capacity_dp import dp_ep_report
    from sim.config.specs import check_ep, check_tp

    if gpus % dp:
        raise ValueError(f"--dp {dp}: must divide --gpus {gpus} into equal tensor-parallel "
                         "ranks")
    tp = gpus // dp
    try:
        check_tp(model, tp)
        check_ep(model, tp, ep, dp)
    except ValueError as err:
        hint = f" (give --ep {gpus})" if model.is_moe and ep != gpus else ""
        raise ValueError(f"--dp {dp}: {err}{hint}") from None
    report = dp_ep_report(
        model, hw, dp, tp, context_tokens=context_tokens(args.context),
        memory_utilization=number(float, "--memory-utilization", args.memory_utilization,
                                  "a fraction in (0, 1]", lambda v: 0 < v <= 1),
        block_size=positive_int("--block-size", args.block_size))
    print(json.dumps(report, indent=2) if args.json else format_dp_report(report))
    return 0 if report["rank_max_concurrency"] >= 1 else EXIT_DOES_NOT_FIT


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `capacity`; numbers are parsed in `run` so bad ones get a one-line error."""
    p = subparsers.add_parser(
        "capacity", help="KV, weights, memory budget, decode floor and concurrency for a model",
        description="Back-of-envelope serving capacity, every term with its formula. "
                    "Exit status 1 when not even one sequence fits; the report then says by "
                    "how much and the smallest --gpus that fits.")
    p.add_argument("--model", help=f"catalogue model (default {DEFAULT_MODEL}); with "
                                    "--model-field/--model-file it is the base to override")
    p.add_argument("--model-file", help="YAML/JSON mapping of ModelSpec fields (may set base)")
    p.add_argument("--model-field", dest="model_fields", action="append", default=[],
                   metavar="KEY=VALUE", help="a ModelSpec field, e.g. num_layers=40 (repeatable)")
    p.add_argument("--gpu", default="h100-sxm", help="catalogue GPU (default h100-sxm)")
    p.add_argument("--gpus", default="1", help="tensor-parallel GPU count (default 1)")
    p.add_argument("--ep", default="1", help="MoE: expert-parallel GPUs of the --gpus group, "
                   "each holding num_experts / ep whole experts (default 1: experts sliced "
                   "by tensor parallelism)")
    p.add_argument("--dp", default="1", help="MoE: data-parallel attention ranks over the "
                   "--gpus GPUs (--gpus / dp GPUs of TP each), experts over all of them "
                   "(give --ep equal to --gpus); prints the per-GPU DP/EP memory split")
    p.add_argument("--context", default="8192",
                   help="tokens per sequence, or e.g. 128k = 131072 (default 8192)")
    p.add_argument("--batch", default="32", help="concurrent sequences (default 32)")
    p.add_argument("--memory-utilization", default="0.9",
                   help="fraction of GPU memory the server may use (default 0.9)")
    p.add_argument("--config", help="a Hugging Face config.json, or the folder holding it "
                   "(its quantization_config sets the weight dtype)")
    p.add_argument("--weight-dtype", help=f"matmul weights' dtype (default: the model's, "
                   f"bf16); one of {', '.join(DTYPE_NAMES)}")
    p.add_argument("--expert-dtype", help="routed experts' dtype (default: --weight-dtype)")
    p.add_argument("--kv-dtype", help="KV cache dtype (default bf16; fp8 halves it)")
    p.add_argument("--dtype-bytes", help="deprecated: use --weight-dtype and --kv-dtype")
    p.add_argument("--block-size", default="16", help="KV block size in tokens (default 16)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)
