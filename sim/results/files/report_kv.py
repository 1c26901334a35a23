"""The printed report's lines for KV that moves: a disaggregated fleet's hand-offs and
pools, and the prefix cache's offload tiers (summary.json's `disaggregation`, `kv_offload`)."""

from __future__ import annotations

import math
from typing import Any


def _num(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec)


def kv_move_lines(summary: dict[str, Any], width: int) -> list[str]:
    """Lines for the hand-offs and each pool (batch, KV token slots held while its steps
    ran: a prefill instance's blocks leave as its requests finish, so KV read after a step
    would show none), and the host tier."""
    lines: list[str] = []
    dis = summary.get("disaggregation")
    if dis:
        lines.append(f"{' Disaggregation (unvalidated) ':-^{width}}")
        lines.append(f"KV transfer ms p50/p99: {_num(dis['p50_kv_transfer_ms'], '.2f')} / "
                     f"{_num(dis['p99_kv_transfer_ms'], '.2f')} over {dis['link']} "
                     f"({dis['num_transfers']} transfers, "
                     f"{_num(dis['kv_transfer_bytes'] / 1e9, '.3g')} GB)")
        lines.append(f"2nd-token gap ms p50/p99: {_num(dis['p50_second_token_gap_ms'], '.1f')}"
                     f" / {_num(dis['p99_second_token_gap_ms'], '.1f')}; decode reservation "
                     f"wait p99 {_num(dis['p99_decode_reservation_wait_ms'], '.1f')} ms")
        lines.append(f"{'pool':>8} {'inst':>5} {'GPUs':>5} {'batch':>7} {'KV tok held':>11} "
                     f"{'KV blk':>8} {'queue ms':>8} {'p99':>8} {'steps':>8}")
        for name, pool in dis["pools"].items():
            lines.append(f"{name:>8} {pool['replicas']:>5} {pool['gpus']:>5} "
                         f"{_num(pool.get('mean_batch_size'), '.2f'):>7} "
                         f"{_num(pool.get('mean_kv_slots_held'), '.0f'):>11} "
                         f"{_num(pool.get('kv_blocks_total'), 'd'):>8} "
                         f"{_num(pool.get('mean_queue_ms'), '.1f'):>8} "
                         f"{_num(pool.get('p99_queue_ms'), '.1f'):>8} "
                         f"{_num(pool.get('num_steps'), 'd'):>8}")
    offload = summary.get("kv_offload")
    if offload:
        lines.append(f"{' KV offload tiers (unvalidated) ':-^{width}}")
        lines.append(f"{offload['load']} loads: {offload['loaded_blocks']} blocks, "
                     f"{_num(offload['load_s'], '.3g')} s")
        for name, tier in offload["tiers"].items():
            lines.append(f"{name}: hit rate {_num(tier['hit_rate'], '.1%')}, loaded "
                         f"{tier['loaded_blocks']} blocks "
                         f"({_num(tier[f'bytes_from_{name}'] / 1e9, '.3g')} GB), written "
                         f"{tier['written_blocks']}, dropped {tier['dropped_blocks']}")
    return lines
