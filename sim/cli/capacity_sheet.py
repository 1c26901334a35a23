"""The capacity sheet as text: each row a label, its formula with the numbers plugged in,
and the result.

Apart from the command (sim.cli.capacity) because it is pure formatting of
sim.config.capacity's report dict: the command parses, checks and prints; this reads
a report and returns a string, so tests and notebooks format a report without a command
line, and `servesim --help` does not load it.
"""

from __future__ import annotations

from typing import Any

_GIB = 1024**3
GPUS_PER_NODE = 8  # tensor parallelism past one node's NVLink domain is rare in practice


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / _GIB:,.2f} GiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def _gpus(tp: int | None, gpu: str, heads: int) -> str:
    if tp is None:
        return f"no tensor-parallel group of up to {heads} x {gpu} fits"
    node = f", more than one {GPUS_PER_NODE}-GPU node" if tp > GPUS_PER_NODE else ""
    return f"--gpus {tp} ({tp} x {gpu}{node})"


def _moe_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """MoE: weights per GPU under TP and under EP, and the experts a decode step reads."""
    if not r["is_moe"]:
        return []
    text = f"TP slices every expert: {_gib(r['weights_bytes_per_gpu_tp'])} per GPU"
    if r["weights_bytes_per_gpu_ep"] is not None:
        text += (f"; EP {r['tp']} ({r['num_experts'] // r['tp']} whole experts per GPU): "
                 f"{_gib(r['weights_bytes_per_gpu_ep'])} per GPU")
    touched = (f"{r['decode_experts_touched']:,.1f} of {r['num_experts']} experts per MoE layer "
               f"on the busiest GPU at batch {r['batch_size']:,} (E(1-(1-k/E)^B), k = "
               f"{r['experts_per_token']}{', ep ' + str(r['ep']) if r['ep'] > 1 else ''})")
    return [("  TP vs EP", text), ("  experts read", touched)]


def _concurrency(r: dict[str, Any]) -> str:
    if r["sliding_layers"] or r["linear_layers"]:
        return (f"{_gib(r['kv_budget_bytes'])} / {_gib(r['kv_bytes_per_seq_blocks'])} per "
                f"{r['context_tokens']:,}-token sequence (sliding layers: their window, in "
                "whole blocks) = ")
    return (f"{r['kv_budget_blocks']:,} blocks / {r['blocks_per_seq']:,} blocks per "
            f"{r['context_tokens']:,}-token sequence = ")


def _pool_note(r: dict[str, Any]) -> str:
    """The simulator's pool holds fewer when sliding blocks are not freed."""
    if r["pool_max_concurrency"] == r["max_concurrency"]:
        return ""
    return (f"; the simulator's pool, which does not yet free blocks leaving a sliding "
            f"window, holds {r['pool_max_concurrency']:,}")


def _verdict(r: dict[str, Any]) -> str:
    """Why nothing fits, by how much, and the smallest tensor-parallel group that does."""
    need = r["weights_bytes_per_gpu"] + r["activation_reserve_bytes"]
    if not r["weights_fit"]:
        why = (f"does NOT fit: {_gib(r['weights_bytes_per_gpu'])} weights + "
               f"{_gib(r['activation_reserve_bytes'])} activations = {_gib(need)} per GPU, "
               f"{_gib(-r['memory_left_bytes'])} more than the {_gib(r['usable_memory_bytes'])} "
               "usable")
    else:
        why = (f"does NOT fit: the {_gib(r['memory_left_bytes'])} left after weights and "
               f"activations holds {r['kv_budget_blocks']:,} blocks, fewer than the "
               f"{r['blocks_per_seq']:,} of one {r['context_tokens']:,}-token sequence "
               f"({_gib(r['kv_bytes_per_seq'])})")
    one = _gpus(r["min_gpus_one_sequence"], r["gpu"], r["num_heads"])
    text = f"{why}; smallest that holds one sequence: {one}"
    if r["batch_size"] > 1 and r["min_gpus_one_sequence"] is not None:
        batch = _gpus(r["min_gpus_batch"], r["gpu"], r["num_heads"])
        text += f"; batch {r['batch_size']:,}: {batch}"
    return text


def _dtype(r: dict[str, Any], which: str) -> str:
    """e.g. 'fp8-block 1.0002 B' or 'bf16 2 B': a dtype with its stored bytes per element."""
    size = {"weight": r["weight_bytes_per_param"], "expert": r["expert_bytes_per_param"],
            "kv": r["kv_bytes_per_element"]}[which]
    return f"{r[f'{which}_dtype']} {size:.5g} B"


def _weights_dtypes(r: dict[str, Any]) -> str:
    text = f"weights {_dtype(r, 'weight')}"
    if r["is_moe"] and r["expert_dtype"] != r["weight_dtype"]:
        text += f", experts {_dtype(r, 'expert')}"
    return f"{text}, embeddings/norms {r['carrier_dtype']}"


def _kv_formula(r: dict[str, Any]) -> str:
    """KV per token by attention kind, the numbers plugged in."""
    kv = _dtype(r, "kv")
    layers = r["full_layers"] + r["sliding_layers"]
    if r["attention"] == "mla":
        per_layer = (f"({r['kv_lora_rank']} kv_lora_rank + {r['qk_rope_head_dim']} rope) x "
                     f"{kv} (MLA latent, whole on every GPU)")
    else:
        per_layer = f"2 x {r['kv_heads_per_gpu']} kv_heads x {r['head_dim']} head_dim x {kv}"
    text = f"{layers} layers x {per_layer} = {r['kv_bytes_per_token']:,.0f} B"
    if r["sliding_layers"]:
        text += (f" ({r['sliding_layers']} of them sliding: they keep at most "
                 f"{r['sliding_window']:,} tokens)")
    if r["linear_layers"]:
        text += (f"; + {r['linear_layers']} linear/SSM layers' state "
                 f"{_gib(r['linear_state_bytes_per_seq'])} per sequence")
    return text


def format_report(r: dict[str, Any]) -> str:
    """The report as aligned text: label, formula with numbers plugged in, result.

    When not even one sequence fits, the rows that assume a running server
    (concurrency, decode floor, crossover, the pool) give way to the verdict.
    """
    ctx, batch = r["context_tokens"], r["batch_size"]
    if r["batch_fits"]:
        fits = "fits"
    else:
        fits = (f"does NOT fit; "
                f"{_gpus(r['min_gpus_batch'], r['gpu'], r['num_heads'])} fits it"
                if r["min_gpus_batch"] is not None else "does NOT fit on any tensor-parallel "
                f"group of up to {r['num_heads']} GPUs")
    if r["crossover_batch"] is None:
        crossover = (f"never: each sequence's KV read ({_ms(r['decode_kv_read_per_seq_s'])}) "
                     f"outlasts its compute ({_ms(r['decode_compute_per_seq_s'])}), "
                     "so decode stays memory-bound at any batch")
    else:
        reach = "reachable" if r["crossover_batch"] <= r["max_concurrency"] else (
            f"beyond the {r['max_concurrency']} sequences that fit")
        crossover = (f"batch {r['crossover_batch']:,.1f} (compute time = HBM time; {reach}; "
                     f"per sequence {_ms(r['decode_compute_per_seq_s'])} compute vs "
                     f"{_ms(r['decode_kv_read_per_seq_s'])} KV read)")
    budget = (f"{_gib(r['gpu_memory_bytes'])} x {r['memory_utilization']:g} - "
              f"{_gib(r['weights_bytes_per_gpu'])} weights - "
              f"{_gib(r['activation_reserve_bytes'])} activations = ")
    if r["weights_fit"]:
        budget += (f"{_gib(r['kv_budget_bytes'])} = {r['kv_budget_blocks']:,} blocks x "
                   f"{r['block_size']} = {r['kv_budget_tokens']:,} tokens")
    else:
        budget += f"{_gib(r['memory_left_bytes'])}: no room for KV"
    rows = [
        ("setup", f"{r['model']} on {r['tp']} x {r['gpu']}, {_weights_dtypes(r)}, "
                  f"KV {_dtype(r, 'kv')}, context {ctx:,} x batch {batch:,} (all figures "
                  "per GPU)"),
        ("params", f"{r['total_params'] / 1e9:,.2f} B total, "
                   f"{r['active_params'] / 1e9:,.2f} B active per token"),
        ("KV per token", _kv_formula(r)),
        ("KV ctx x batch", f"{_gib(r['kv_bytes_per_seq'])} per {ctx:,}-token sequence in "
                           f"KV {r['kv_dtype']} x {batch:,} seqs "
                           f"= {_gib(r['kv_bytes_context_batch'])}"),
        ("weights", f"{r['total_params'] / 1e9:,.2f} B params in {_weights_dtypes(r)} "
                    f"/ {r['tp']} GPU(s) (norms replicated) = "
                    f"{_gib(r['weights_bytes_per_gpu'])}"),
        *_moe_rows(r),
        ("activations", f"{r['max_num_batched_tokens']:,} batched tokens' layer buffers in "
                        f"{r['carrier_dtype']} + fp32 logits for {r['max_num_seqs']} seqs = "
                        f"{_gib(r['activation_reserve_bytes'])}"),
        ("KV budget", budget),
    ]
    if not r["fits"]:
        rows.append(("fit", _verdict(r)))
    else:
        rows += [
            ("max concurrency", _concurrency(r) + f"{r['max_concurrency']:,} sequences "
                                f"(batch {batch:,} {fits})" + _pool_note(r)),
            ("decode floor", f"({_gib(r['decode_weights_read_bytes'])} weights "
                             f"({r['weight_dtype']}) + {_gib(r['kv_bytes_context_batch'])} KV "
                             f"({r['kv_dtype']})) / "
                             f"{r['memory_bandwidth_bytes_per_s'] / 1e12:,.2f} TB/s = "
                             f"{_ms(r['decode_step_floor_s'])} per step at batch {batch:,}"),
            *([("roofline step", f"{_ms(r['roofline_decode_step_s'])} per decode step at batch "
                                 f"{batch:,}: the default latency model, "
                                 f"{r['roofline_family']} ({r['roofline_family_why']}); "
                                 f"host {_ms(r['roofline_cpu_s'])} a step, "
                                 f"{_ms(r['roofline_host_visible_s'])} of it beyond the GPU's "
                                 f"time (async scheduling), tokens out "
                                 f"{_ms(r['roofline_output_lag_s'])} after it"),
                ("frontend", f"API server {_ms(r['frontend_api_server_s'])} + tokenizing "
                             f"{ctx:,} tokens {_ms(r['frontend_tokenize_s'])} + detokenizing "
                             f"and streaming a token {_ms(r['frontend_token_out_s'])} = "
                             f"{_ms(r['frontend_offset_s'])} on each TTFT and E2E a client "
                             f"sees")]
              if "roofline_decode_step_s" in r else []),
            ("crossover", crossover),
            ("  weights only", f"batch {r['crossover_batch_weights_only']:,.1f}: where the "
                               "linear layers alone turn compute-bound (attention's KV reads "
                               "ignored)"),
            ("KV / weights", f"{_gib(r['kv_bytes_context_batch'])} / "
                             f"{_gib(r['weights_bytes_per_gpu'])} = "
                             f"{r['kv_to_weights_ratio']:,.2f}"),
            ("  one sequence", f"{ctx:,} tokens in KV {r['kv_dtype']} = "
                               f"{_gib(r['kv_bytes_per_seq'])} = "
                               f"{r['kv_seq_to_weights_ratio']:,.2f} x the weights"),
            ("  whole KV pool", f"{r['kv_budget_tokens']:,} tokens x "
                                f"{r['kv_bytes_per_token']:,.0f} B = "
                                f"{_gib(r['kv_budget_tokens'] * r['kv_bytes_per_token'])} = "
                                f"{r['kv_pool_to_weights_ratio']:,.2f} x the weights "
                                f"({r['max_concurrency']:,} sequences of {ctx:,} tokens)"),
        ]
    if r["context_exceeds_model"]:
        rows.append(("note", f"context {ctx:,} exceeds {r['model']}'s maximum of "
                             f"{r['model_max_context_tokens']:,} tokens: a server rejects "
                             "such requests (the memory terms still hold for its shape)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)
