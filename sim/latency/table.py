"""Table latency: a step's time from coefficients fitted to engine measurements.

The model is the one Vidur and vLLM's own profiling arrive at, in a form a
non-negative least-squares fit can recover (`calibrate.fit`):

    step_ms = intercept                          per-step launch, sampling, input prep
            + linear(rows)                       every matmul of the step
            + a * sum_chunks chunk * (context + chunk / 2)   prefill attention pairs
            + b * decode_context_sum * query_tokens           decode attention KV reads
            + c * num_prefills + d * num_decodes              per-sequence bookkeeping
            + e * num_decodes * widest sequence               decode attention padded to the
                                                              step's widest block table
            + f if no decode runs (prefill only)              the first step after idling
            + g * num_spec_decodes                        a verify's drafting + acceptance

`rows` are the token rows the matmuls run over (prefill tokens, one row per
decode query token, and padded slots). A speculative verify runs 1 + k query
tokens per decode (StepShape.num_spec_tokens); its attention term is
decode_context_sum + mean k x spec_context_sum, which is decode_context_sum x
query tokens when every decode verifies the same k, as in a profiled step.

`linear` is piecewise linear over a grid of token counts (the knots) with
non-negative slopes, so it is monotone:
a GPU is flat while the weights' read dominates (memory-bound) and linear
once compute dominates, and interpolating between measured token counts
tracks that bend without assuming where it is. Below the first knot it is
flat; past the last knot it extends the last segment's slope, so shapes
beyond the measured range extrapolate linearly (the other terms are linear
everywhere). Swap preemption's KV transfers add host-link time as in the
roofline model. `step_time` is a few float operations and one bisect.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from sim.core.plan import StepShape

TIMINGS = ("wall", "device")


class ErrorStats(NamedTuple):
    """Absolute percentage error of predictions on a group of measurements.

    A NamedTuple, not a frozen dataclass: cheaper to import (no generated methods to compile at
    start-up) and to build.
    """

    kind: str  # a measurement kind, or "all"
    points: int
    mean_ape_pct: float
    p90_ape_pct: float


@dataclass(frozen=True, slots=True)
class TableFit:
    """Fitted coefficients, in milliseconds; `knots_tokens` has one more entry than slopes.

    `segment_slopes_ms_per_token[i]` is the slope from knot i to knot i + 1;
    the last one also applies past the last knot.
    """

    timing: str
    knots_tokens: tuple[int, ...]
    intercept_ms: float
    segment_slopes_ms_per_token: tuple[float, ...]
    prefill_attention_ms_per_pair: float
    decode_attention_ms_per_token: float
    prefill_seq_ms: float
    decode_seq_ms: float
    # an engine whose decode attention gathers every row's KV to the step's widest block
    # table (gpu_engine on CPU) pays per decode for the widest sequence, not its own context
    decode_padded_attention_ms_per_token: float = 0.0
    # a prefill-only step (no decode running) is in serving the first after an idle wait,
    # which on a shared CPU host runs cache-cold: its extra cost
    idle_start_ms: float = 0.0
    # a speculative verify's host work per drafting sequence: proposing its drafts, the
    # acceptance rule over its k + 1 rows, rolling back what was rejected
    verify_seq_ms: float = 0.0
    measurements_sha256: str = ""
    fitted_points: int = 0
    held_out: tuple[ErrorStats, ...] = ()

    def __post_init__(self) -> None:
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        knots = self.knots_tokens
        if len(knots) < 2 or any(b <= a for a, b in zip(knots, knots[1:], strict=False)):
            raise ValueError(f"knots_tokens must be at least 2 increasing token counts, "
                             f"got {list(knots)}")
        if len(self.segment_slopes_ms_per_token) != len(knots) - 1:
            raise ValueError(f"segment_slopes_ms_per_token needs {len(knots) - 1} entries "
                             f"(one per pair of knots), got "
                             f"{len(self.segment_slopes_ms_per_token)}")
        values = (self.intercept_ms, *self.segment_slopes_ms_per_token,
                  self.prefill_attention_ms_per_pair, self.decode_attention_ms_per_token,
                  self.prefill_seq_ms, self.decode_seq_ms,
                  self.decode_padded_attention_ms_per_token, self.idle_start_ms,
                  self.verify_seq_ms)
        if not all(np.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"coefficients must be finite and >= 0, got {values}")

    @property
    def other_coefficients_ms(self) -> tuple[float, float, float, float]:
        """Coefficients of `step_features`' last four entries, in that order."""
        return (self.prefill_attention_ms_per_pair, self.decode_attention_ms_per_token,
                self.prefill_seq_ms, self.decode_seq_ms)


def step_features(shape: StepShape) -> tuple[int, float, float, int, int]:
    """(matmul rows, prefill attention pairs, decode attention tokens, prefills, decodes)."""
    prefill_tokens = 0
    pairs = 0.0
    for chunk, context in zip(shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                              strict=True):
        prefill_tokens += chunk
        pairs += chunk * (context + chunk * 0.5)
    prefills, decodes, drafts = len(shape.prefill_chunk_tokens), shape.num_decodes, 0
    decode_tokens = float(shape.decode_context_sum)
    if shape.num_spec_decodes:
        drafts = shape.num_spec_tokens
        decode_tokens += drafts / shape.num_spec_decodes * shape.spec_context_sum
    padding = max(0, shape.padded_batch - prefills - decodes)  # padded slots run matmuls only
    rows = prefill_tokens + decodes + drafts + padding
    return rows, pairs, decode_tokens, prefills, decodes


def decode_padded_tokens(shape: StepShape) -> float:
    """num_decodes x the step's widest sequence (tokens it attends over, prefill chunks too)."""
    if not shape.num_decodes:
        return 0.0
    widest = shape.decode_context_max + 1
    for chunk, context in zip(shape.prefill_chunk_tokens, shape.prefill_context_tokens,
                              strict=True):
        widest = max(widest, context + chunk)
    return float(shape.num_decodes * widest)


def starts_from_idle(shape: StepShape) -> float:
    """1 for a prefill-only step (nothing else running: the engine was idle), else 0."""
    return 1.0 if shape.prefill_chunk_tokens and not shape.num_decodes else 0.0


def ramp_basis(rows: np.ndarray, knots_tokens: tuple[int, ...]) -> np.ndarray:
    """Columns whose non-negative combination is a monotone piecewise-linear function of rows.

    Column i is the part of `rows` that falls between knot i and knot i + 1
    (the last column is unbounded above: linear extrapolation).
    """
    rows = np.asarray(rows, dtype=np.float64)
    knots = np.asarray(knots_tokens, dtype=np.float64)
    basis = np.clip(rows[:, None] - knots[None, :-1], 0.0, None)
    widths = np.diff(knots)
    basis[:, :-1] = np.minimum(basis[:, :-1], widths[None, :-1])
    return basis


@dataclass(frozen=True, slots=True)
class TableLatency:
    """The LatencyModel of a fitted calibration table.

    `cpu_step_s` and `cpu_seq_s`: host time outside a device-time fit, per step
    and per sequence in it (an imported profile's CPU overhead).
    """

    fit: TableFit
    name: str = "table"
    cpu_step_s: float = 0.0
    cpu_seq_s: float = 0.0
    _knots: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _values_s: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _slopes_s: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _others_s: tuple[float, float, float, float] = field(init=False, repr=False,
                                                         compare=False)
    _padded_s: float = field(init=False, repr=False, compare=False)
    _idle_s: float = field(init=False, repr=False, compare=False)
    _verify_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("cpu_step_s", "cpu_seq_s"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        fit = self.fit
        knots = tuple(float(k) for k in fit.knots_tokens)
        slopes = tuple(s / 1e3 for s in fit.segment_slopes_ms_per_token)
        values = [fit.intercept_ms / 1e3]
        for i, slope in enumerate(slopes):
            values.append(values[-1] + slope * (knots[i + 1] - knots[i]))
        # slope to the right of each knot: the last segment's continues past the end
        object.__setattr__(self, "_knots", knots)
        object.__setattr__(self, "_values_s", tuple(values))
        object.__setattr__(self, "_slopes_s", (*slopes, slopes[-1]))
        object.__setattr__(self, "_others_s",
                           tuple(c / 1e3 for c in fit.other_coefficients_ms))
        object.__setattr__(self, "_padded_s", fit.decode_padded_attention_ms_per_token / 1e3)
        object.__setattr__(self, "_idle_s", fit.idle_start_ms / 1e3)
        object.__setattr__(self, "_verify_s", fit.verify_seq_ms / 1e3)

    def linear_s(self, rows: float) -> float:
        """The matmul term at `rows` token rows: flat below the first knot, linear past the last."""
        knots = self._knots
        i = bisect_right(knots, rows) - 1
        if i < 0:
            return self._values_s[0]
        return self._values_s[i] + self._slopes_s[i] * (rows - knots[i])

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        """step_time of each step of a decode run (sim.core.decode_run), in numpy: the same
        terms added in the same order (the zero ones too) for a decode-only shape."""
        n = shape.num_decodes
        grow = np.arange(steps, dtype=np.int64)
        rows = n + (shape.padded_batch - n if shape.padded_batch > n else 0)
        knots = self._knots
        i = bisect_right(knots, rows) - 1
        linear_s = (self._values_s[i] + self._slopes_s[i] * (rows - knots[i]) if i >= 0
                    else self._values_s[0])
        a, b, c, d = self._others_s
        total = linear_s + a * 0.0 + b * (shape.decode_context_sum + n * grow) + c * 0 + d * n
        if self._padded_s:
            total = total + self._padded_s * (n * (shape.decode_context_max + 1 + grow)
                                              ).astype(np.float64)
        else:
            total = total + 0.0
        return total + 0.0 + 0.0 + 0.0 + self.cpu_step_s + self.cpu_seq_s * n

    def step_time(self, shape: StepShape, moved_s: float = 0.0) -> float:
        """Seconds for one step; an empty shape launches nothing and costs 0 (but its moves).
        `moved_s`: the step's synchronous KV moves on idle links (RooflineLatency.step_time)."""
        chunks, decodes = shape.prefill_chunk_tokens, shape.num_decodes
        if not chunks and not decodes:
            return moved_s
        # step_features, inlined: this runs once per simulated step
        prefill_tokens, pairs = 0, 0.0
        for chunk, context in zip(chunks, shape.prefill_context_tokens):  # noqa: B905
            prefill_tokens += chunk
            pairs += chunk * (context + chunk * 0.5)
        seqs = len(chunks) + decodes
        rows = prefill_tokens + decodes + (
            shape.padded_batch - seqs if shape.padded_batch > seqs else 0)
        decode_tokens = shape.decode_context_sum
        verify_s = 0.0
        if shape.num_spec_decodes:
            rows += shape.num_spec_tokens
            decode_tokens += (shape.num_spec_tokens / shape.num_spec_decodes
                              * shape.spec_context_sum)
            verify_s = self._verify_s * shape.num_spec_decodes
        knots = self._knots
        i = bisect_right(knots, rows) - 1
        linear_s = (self._values_s[i] + self._slopes_s[i] * (rows - knots[i]) if i >= 0
                    else self._values_s[0])
        a, b, c, d = self._others_s
        padded_s = self._padded_s * decode_padded_tokens(shape) if self._padded_s else 0.0
        idle_s = self._idle_s if not decodes else 0.0
        return (linear_s + a * pairs + b * decode_tokens + c * len(chunks) + d * decodes
                + padded_s + idle_s + verify_s + moved_s + self.cpu_step_s + self.cpu_seq_s * seqs)
