"""`servesim capacity --dp N` as text: one GPU's memory under data-parallel attention with
expert parallelism, every term, then what the ranks hold together beside pure tensor
parallelism over the same GPUs. Pure formatting of sim.config.capacity_dp's report."""

from __future__ import annotations

from typing import Any

_GIB = 1024**3


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / _GIB:,.2f} GiB"


def _tp_only(r: dict[str, Any]) -> list[tuple[str, str]]:
    t = r["tp_only"]
    if "error" in t:
        return [("TP only", f"no tensor-parallel group of {r['gpus']} GPUs: {t['error']}")]
    return [("TP only", f"the same {r['gpus']} GPUs as one TP{t['tp']} group (experts "
                        f"sliced): weights {_gib(t['weights_bytes'])} + activations "
                        f"{_gib(t['activation_reserve_bytes'])} per GPU, KV budget "
                        f"{_gib(t['kv_budget_bytes'])} at {t['kv_bytes_per_token']:,.0f} B "
                        f"a token = {t['kv_tokens']:,} tokens, {t['max_concurrency']:,} "
                        f"sequences of {r['context_tokens']:,}")]


def format_dp_report(r: dict[str, Any]) -> str:
    """The DP/EP sheet, a row per term (all per GPU unless a row says the group)."""
    dp, tp, gpus = r["dp"], r["tp"], r["gpus"]
    mla = (" (MLA: the whole latent, for this rank's sequences only)"
           if r["attention"] == "mla" else "")
    rows = [
        ("setup", f"{r['model']} on {gpus} x {r['gpu']}: {dp} data-parallel attention "
                  f"ranks x TP{tp}, experts over all {gpus} GPUs (EP{gpus}); per GPU"),
        ("attention+dense", f"{_gib(r['replicated_weights_bytes'])}: attention, dense MLPs, "
                            f"shared experts, 1/{tp} of the rank's copy (one copy per rank)"),
        ("norms+routers", f"{_gib(r['replicated_carrier_bytes'])} (whole on every GPU)"),
        ("vocabulary", f"{_gib(r['replicated_vocab_bytes'])}: embedding and lm_head, 1/{tp} "
                       "of the rank's copy"),
        ("routed experts", f"{_gib(r['experts_bytes'])}: {r['num_experts']} / {gpus} = "
                           f"{r['experts_per_gpu']:g} whole experts per MoE layer"),
        ("weights", f"{_gib(r['weights_bytes'])} per GPU"),
        ("activations", _gib(r["activation_reserve_bytes"])),
        ("KV budget", f"{_gib(r['usable_memory_bytes'])} usable "
                      f"({r['memory_utilization']:g} x {_gib(r['gpu_memory_bytes'])}) - "
                      f"weights - activations = {_gib(r['rank_kv_budget_bytes'])}"),
        ("KV per rank", f"{r['rank_kv_bytes_per_token']:,.0f} B a token on each GPU{mla}: "
                        f"{r['rank_kv_tokens']:,} tokens, {r['rank_max_concurrency']:,} "
                        f"sequences of {r['context_tokens']:,} per rank"),
        ("group", f"{dp} ranks: {r['group_kv_tokens']:,} KV tokens, "
                  f"{r['group_max_concurrency']:,} sequences; weights "
                  f"{_gib(r['group_weights_bytes'])} = experts "
                  f"{_gib(r['group_expert_bytes'])} (the model's "
                  f"{_gib(r['model_expert_bytes'])}, split, not copied) + "
                  f"{_gib(r['group_replicated_bytes'])} the rest ({dp} copies)"),
        *_tp_only(r),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)
