"""Accumulates one step's plan columns and its shape, sequence by sequence or in bulk.

The running set (running_batch.py) fills whole columns from numpy at once and
then adds the few newly admitted requests one at a time. A step's sequences
are the running set's first rows (admission order, those that got tokens)
followed by the admitted ones, which the running set appends to its rows as
they come: so the request ids and block tables are not copied here but read
from the running set's lists at build(), one tuple each. The running set's
usual steady state, every sequence a plain decode, is `decodes` leading rows
whose new tokens (1), prefill (no) and emission (yes) build() writes at once.

Speculative decodes (k_i > 0: `spec` in add(), or the running set's column) get a
`num_spec_tokens` column, created on the first one so that steps without
speculation build exactly the plans they always did.
"""

from __future__ import annotations

from sim.core.plan import StepPlan, StepShape


class PlanBuilder:
    """A step's columns as lists, turned into a frozen StepPlan by build()."""

    __slots__ = ("size", "decodes", "num_new", "contexts", "prefills", "emits",
                 "chunk_tokens", "chunk_contexts", "num_decodes", "decode_sum", "decode_max",
                 "swap_out_tokens", "swap_in_tokens", "spec", "num_spec_decodes",
                 "spec_tokens", "spec_depth", "spec_context_sum")

    def __init__(self) -> None:
        self.size = 0  # sequences in the step
        # the first `decodes` sequences are plain decodes: num_new, prefills and emits
        # hold only the sequences after them (contexts holds every sequence's)
        self.decodes = 0
        self.num_new: list[int] = []
        self.contexts: list[int] = []
        self.prefills: list[bool] = []
        self.emits: list[bool] = []
        self.chunk_tokens: list[int] = []
        self.chunk_contexts: list[int] = []
        self.num_decodes = self.decode_sum = self.decode_max = 0
        self.swap_out_tokens = self.swap_in_tokens = 0
        self.spec: list[int] | None = None  # k_i per sequence, once one drafts
        self.num_spec_decodes = self.spec_tokens = self.spec_depth = self.spec_context_sum = 0

    def add(self, new: int, computed: int, known: int, output_done: int, spec: int = 0) -> None:
        """Append one sequence with these pre-step counters (`known`: prompt + output done);
        its id and table are the next row of the running set's lists.

        `spec`: draft tokens among `new` (a speculative decode: new = 1 + spec).
        """
        own = new  # the tokens it computes for itself: all but the drafts
        if spec or self.spec is not None:
            self._add_spec(computed, spec)
            own -= spec
        # a row with drafts is a verify whatever came before (a padded admission too)
        is_decode = own == 1 and computed == known - 1 and (output_done > 0 or spec > 0)
        self.size += 1
        self.num_new.append(new)
        self.contexts.append(computed)
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
            self.spec = [0] * self.size
        self.spec.append(spec)
        if not spec:
            return
        self.num_spec_decodes += 1
        self.spec_tokens += spec
        self.spec_context_sum += computed
        if spec > self.spec_depth:
            self.spec_depth = spec

    def build(self, request_ids: list[int], tables: list[tuple[int, ...]],
              preempted: tuple[int, ...], padded_batch: int = 0) -> StepPlan:
        """The frozen plan of the first `size` rows of the running set's `request_ids` and
        `tables`; `padded_batch`: slots the kernels run over, if more than its sequences
        (a CUDA-graph bucket)."""
        n = self.size
        if len(request_ids) != n:
            request_ids, tables = request_ids[:n], tables[:n]
        shape = StepShape(tuple(self.chunk_tokens), tuple(self.chunk_contexts), self.num_decodes,
                          self.decode_sum, self.decode_max, max(padded_batch, n),
                          self.swap_out_tokens, self.swap_in_tokens, self.num_spec_decodes,
                          self.spec_tokens, self.spec_depth, self.spec_context_sum)
        head = self.decodes
        num_new, prefills, emits = tuple(self.num_new), tuple(self.prefills), tuple(self.emits)
        if head:
            num_new = (1,) * head + num_new
            prefills = (False,) * head + prefills
            emits = (True,) * head + emits
        return StepPlan(tuple(request_ids), num_new, tuple(self.contexts), tuple(tables),
                        prefills, emits, shape, preempted,
                        tuple(self.spec) if self.spec is not None else ())
