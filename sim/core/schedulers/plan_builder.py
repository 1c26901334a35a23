"""Accumulates one step's plan columns and its shape, sequence by sequence or in bulk.

The running set (running_batch.py) fills whole columns from numpy at once and
then adds the few newly admitted requests one at a time.

Speculative decodes (k_i > 0: `spec` in add(), or the running set's column) get a
`num_spec_tokens` column, created on the first one so that steps without
speculation build exactly the plans they always did.
"""

from __future__ import annotations

from sim.core.plan import StepPlan, StepShape
from sim.core.request import Request


class PlanBuilder:
    """A step's columns as lists, turned into a frozen StepPlan by build()."""

    __slots__ = ("request_ids", "num_new", "contexts", "tables", "prefills", "emits",
                 "chunk_tokens", "chunk_contexts", "num_decodes", "decode_sum", "decode_max",
                 "swap_out_tokens", "swap_in_tokens", "spec", "num_spec_decodes",
                 "spec_tokens", "spec_depth", "spec_context_sum")

    def __init__(self) -> None:
        self.request_ids: list[int] = []
        self.num_new: list[int] = []
        self.contexts: list[int] = []
        self.tables: list[tuple[int, ...]] = []
        self.prefills: list[bool] = []
        self.emits: list[bool] = []
        self.chunk_tokens: list[int] = []
        self.chunk_contexts: list[int] = []
        self.num_decodes = self.decode_sum = self.decode_max = 0
        self.swap_out_tokens = self.swap_in_tokens = 0
        self.spec: list[int] | None = None  # k_i per sequence, once one drafts
        self.num_spec_decodes = self.spec_tokens = self.spec_depth = self.spec_context_sum = 0

    def add(self, req: Request, new: int, table: tuple[int, ...], spec: int = 0) -> None:
        """Append one sequence; `req`'s counters must be exact (pre-step values).

        `spec`: draft tokens among `new` (a speculative decode: new = 1 + spec).
        """
        computed = req.num_computed_tokens
        known = req.prompt_tokens + req.num_output_done
        own = new  # the tokens it computes for itself: all but the drafts
        if spec or self.spec is not None:
            self._add_spec(computed, spec)
            own -= spec
        # a row with drafts is a verify whatever came before (a padded admission too)
        is_decode = own == 1 and computed == known - 1 and (req.num_output_done > 0 or spec > 0)
        self.request_ids.append(req.request_id)
        self.num_new.append(new)
        self.contexts.append(computed)
        self.tables.append(table)
        self.prefills.append(not is_decode)
        self.emits.append(computed + own == known)
        if is_decode:
            self.num_decodes += 1
            self.decode_sum += computed
            if computed > self.decode_max:
                self.decode_max = computed
        else:
            self.chunk_tokens.append(new)
            self.chunk_contexts.append(computed)

    def _add_spec(self, computed: int, spec: int) -> None:
        if self.spec is None:
            self.spec = [0] * len(self.request_ids)
        self.spec.append(spec)
        if not spec:
            return
        self.num_spec_decodes += 1
        self.spec_tokens += spec
        self.spec_context_sum += computed
        if spec > self.spec_depth:
            self.spec_depth = spec

    def build(self, preempted: tuple[int, ...], padded_batch: int = 0) -> StepPlan:
        """The frozen plan; `padded_batch`: slots the kernels run over, if more than its
        sequences (a CUDA-graph bucket)."""
        shape = StepShape(tuple(self.chunk_tokens), tuple(self.chunk_contexts), self.num_decodes,
                          self.decode_sum, self.decode_max,
                          max(padded_batch, len(self.request_ids)),
                          self.swap_out_tokens, self.swap_in_tokens, self.num_spec_decodes,
                          self.spec_tokens, self.spec_depth, self.spec_context_sum)
        return StepPlan(tuple(self.request_ids), tuple(self.num_new), tuple(self.contexts),
                        tuple(self.tables), tuple(self.prefills), tuple(self.emits), shape,
                        preempted, tuple(self.spec) if self.spec is not None else ())
