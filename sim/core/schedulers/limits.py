"""Length limits every scheduler applies: who can never run, and what a request reserves.

Shared so that static, dynamic and continuous batching reject the same requests
with the same reasons, and size contiguous reservations the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.kv import KVManager
from sim.core.request import Request


@dataclass(frozen=True, slots=True)
class LengthLimits:
    """`max_output_tokens`: the output a server reserves for; None = up to max_model_len.

    A server without paging cannot know how long an answer will be, so it reserves
    the most it allows: max_model_len - prompt unless a smaller output cap is set.
    Scripted outputs longer than the cap are rejected rather than truncated, so
    every finished request emits exactly its scripted length.
    """

    max_model_len: int | None = None
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {self.max_output_tokens}")

    @property
    def bounded(self) -> bool:
        """Whether reservations have a size (a contiguous pool needs one)."""
        return self.max_model_len is not None or self.max_output_tokens is not None

    def reserve_tokens(self, request: Request) -> int | None:
        """prompt + maximum output, capped by max_model_len; None when nothing bounds it."""
        if self.max_output_tokens is None:
            return self.max_model_len
        total = request.prompt_tokens + self.max_output_tokens
        return total if self.max_model_len is None else min(total, self.max_model_len)

    def never_fits(self, request: Request, kv: KVManager) -> str | None:
        """Why `request` can never run on `kv`, or None (asked once per arrival)."""
        prompt, output = request.prompt_tokens, request.output_tokens
        total = prompt + output
        max_len, max_output = self.max_model_len, self.max_output_tokens
        if max_len is not None and total > max_len:
            return f"prompt+output {total} > max_model_len {max_len}"
        if max_output is None:
            reserve = max_len
        else:
            if output > max_output:
                return f"output {output} > max_output_tokens {max_output}"
            reserve = prompt + max_output if max_len is None else min(prompt + max_output,
                                                                       max_len)
        peak = kv.peak_tokens(total - 1, reserve)  # total - 1: request.max_kv_tokens
        if kv.blocks_for(peak) > kv.num_usable_blocks:
            pool = kv.num_usable_blocks * kv.block_size
            if peak > total - 1:
                return f"reserves {peak} KV tokens (prompt + max output), pool holds {pool}"
            return f"needs {peak} KV tokens, pool holds {pool}"
        return None
