"""A decode run priced in bulk: every step's time of a run at once, as step_time's floats.

Apart from sim.latency.roofline because a run (sim.core.decode_run) is many steps of
one shape whose contexts grow: only attention changes, so the other parts are priced
once (RooflineParts._decode_parts) and the steps' sums are formed in numpy for long
runs, in plain floats for short ones, operation for operation as step_time would.
sim.latency.runs holds the step-by-step reference this is tested against.
"""

from __future__ import annotations

import numpy as np

from sim.core.decode_run import constant
from sim.core.plan import StepShape
from sim.latency.roofline_parts import RooflineParts
from sim.latency.runs import each_step_s

# A run this long or longer is priced in numpy; shorter in plain floats (same floats):
# about where numpy's ~1 us per operation costs what a plain step's ~0.2 us does.
NUMPY_RUN_STEPS = 32


class RooflineRuns(RooflineParts):
    """RooflineLatency's bulk pricing of a decode run (see the module)."""

    __slots__ = ()

    def decode_run_s(self, shape: StepShape, steps: int) -> np.ndarray:
        """step_time of each step of a decode run (sim.core.decode_run): only attention
        grows with the contexts, so the other parts are priced once and each step's sum is
        step_time's, part for part in the same order (IEEE sums and products, the same in
        numpy as in plain floats, and commutative; numpy's power is never used). Mirrors
        _counts for a decode-only shape.

        A decode's pairs and KV tokens are the same float (context + n), so the larger of
        its compute and HBM time is that float times the larger per-pair/per-token cost:
        a rounded product never decreases when a positive factor grows."""
        if self.host_serial_share < 1.0:  # async host terms: the reference, step by step
            return each_step_s(self.step_time, shape, steps)
        n, layers = shape.num_decodes, self._attn_layers
        # _attention_s and AttentionCost.seconds inlined (the hot loop of a run), operation
        # for operation
        cost = self._decode_attention
        launch_s, min_s, pair_s, token_s = cost.launch_s, cost.min_s, cost.pair_s, cost.token_s
        first = shape.decode_context_sum
        if not self._sliding_share and n:
            head, lm_head_s, cpu_s, collectives_s = self._decode_parts(shape)
            per_token_s = pair_s if pair_s >= token_s else token_s
            tokens0 = first + n  # step s: tokens0 + s * n, an integer (exact as a float)
            # a step's kernel time, launch_s + tokens * per_token_s, never falls as the contexts
            # grow (a rounded sum or product never decreases when an operand grows): under
            # min_s in the last step, every step takes the same float; at or over it in the
            # first, no step is held at the minimum
            if launch_s + (tokens0 + (steps - 1) * n) * per_token_s < min_s:
                return constant(steps, head + layers * min_s + lm_head_s + cpu_s + collectives_s,
                                np.float64)
            floored = launch_s + tokens0 * per_token_s < min_s
            if steps < NUMPY_RUN_STEPS:
                kernel_s = [launch_s + k * per_token_s
                            for k in range(tokens0, tokens0 + steps * n, n)]
                if floored:
                    kernel_s = [t if t >= min_s else min_s for t in kernel_s]
                return np.array([head + layers * t + lm_head_s + cpu_s + collectives_s
                                 for t in kernel_s])
            t = np.arange(tokens0, tokens0 + steps * n, n, dtype=np.float64)
            t *= per_token_s
            t += launch_s
            if floored:
                np.maximum(t, min_s, out=t)
            t *= layers
            t += head
            t += lm_head_s
            t += cpu_s
            if collectives_s:  # none on one GPU: adding 0.0 changes no positive float
                t += collectives_s
            return t
        parts = self._parts(shape)
        if not parts:
            return np.zeros(steps)
        gemms_s, small_s, _, lm_head_s, cpu_s, collectives_s = parts
        head = 0 + gemms_s + small_s  # sum()'s first two additions
        attended = self._attended if self._sliding_share else None
        out = []
        for s in range(steps):
            context = first + s * n if attended is None else attended(first + s * n, n)
            pairs = 0.0 + (context + n)  # each decode also attends to itself
            attention = 0.0
            if pairs:
                compute, memory = pairs * pair_s, float(context + n + 0) * token_s
                kernel = launch_s + (compute if compute >= memory else memory)
                attention = layers * (kernel if kernel >= min_s else min_s)
            out.append(head + attention + lm_head_s + cpu_s + collectives_s + 0.0)
        return np.array(out)
