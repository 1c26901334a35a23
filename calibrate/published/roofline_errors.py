"""The roofline's time for each published point it is fitted on, and its error there.

`stack_ms` prices a fixture's linear-op stack and `attention_ms` an attention
kernel with a given RooflineParams, the same way whatever the constants; the
errors (roofline / measured - 1) are what calibrate.published.fit_roofline minimises
and what benchmarks/roofline_vs_measured.py and the tests judge the committed
constants by. They are apart from the fit because they read no fit: any
RooflineParams goes in. `is_warmup` says which published decode rows time
the harness rather than the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibrate.published.kernels import DecodeAttentionPoint, PrefillAttentionPoint
from calibrate.published.measured import Fixture, LinearOpRow
from calibrate.published.roofline_check import attention_dims, device_hardware, shape_dims
from sim.latency.roofline_fits import RooflineParams
from sim.latency.roofline_terms import (
    decode_attention_s,
    layer_gemms_s,
    prefill_attention_s,
    small_kernels_s,
)


def stack_ms(rows: Sequence[LinearOpRow], params: RooflineParams) -> np.ndarray:
    """The roofline's linear-op layer time (GEMMs + small kernels) of each row, ms."""
    first = rows[0]
    dims = shape_dims(first.shape, first.fixture.tp)
    hw = device_hardware(first.fixture.device)
    tokens = np.array([r.num_tokens for r in rows], dtype=float)
    flops, bw = hw.bf16_flops_per_s, hw.memory_bandwidth_bytes_per_s
    per_layer = (layer_gemms_s(dims, tokens, flops, bw, params)
                 + small_kernels_s(dims, tokens, bw, params))
    return per_layer * 1e3


def stack_errors(groups: dict[Fixture, tuple[LinearOpRow, ...]], params: RooflineParams
                 ) -> dict[Fixture, np.ndarray]:
    """roofline / measured - 1 per row of each fixture."""
    return {f: stack_ms(rows, params) / np.array([r.layer_ms for r in rows]) - 1
            for f, rows in groups.items()}


AttentionPoint = DecodeAttentionPoint | PrefillAttentionPoint


def attention_ms(points: Sequence[AttentionPoint], params: RooflineParams) -> np.ndarray:
    out = []
    for p in points:
        dims, hw = attention_dims(p.attention), device_hardware(p.device)
        if isinstance(p, DecodeAttentionPoint):
            pairs, kv_tokens = p.batch * (p.kv_tokens + 1), p.batch * (p.kv_tokens + 1)
            law = decode_attention_s
        else:
            pairs = p.chunk_tokens * p.context_tokens + p.chunk_tokens * (p.chunk_tokens + 1) / 2
            kv_tokens = p.context_tokens + p.chunk_tokens
            law = prefill_attention_s
        out.append(law(pairs * dims[0], kv_tokens * dims[1], hw.bf16_flops_per_s,
                       hw.memory_bandwidth_bytes_per_s, params) * 1e3)
    return np.array(out)


def attention_errors(points: Sequence[AttentionPoint], params: RooflineParams) -> np.ndarray:
    return attention_ms(points, params) / np.array([p.time_us / 1e3 for p in points]) - 1


def is_warmup(point: DecodeAttentionPoint, table: Sequence[DecodeAttentionPoint]) -> bool:
    """The first row of an inference-sim decode table (batch 1 at its smallest KV) is timed
    at 36-41 µs, slower than batch 1 at 4-16x the KV (22-24 µs): the harness warming up,
    not the kernel. It is left out of the fit and the bounds, and printed apart."""
    same = [q for q in table if q.attention == point.attention and q.device == point.device]
    return point.batch == 1 and point.kv_tokens == min(q.kv_tokens for q in same)
