"""Parallel sampling as vLLM V1 runs it: one HTTP request with n choices is n requests.

vLLM's frontend (`ParentRequest`) splits a request into n children with the
parent's prompt and max_tokens and adds them one after another at the same
instant; the scheduler never sees `n`, and the children share the prompt's full
blocks through the prefix cache. `ServeLoop.submit` splits with this function,
and the parity suite (parity/servesim_side.py) replays vLLM's recorded
parallel-sampling runs through it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.core.request import Request


def split_children(first_id: int, n: int, arrival_s: float, prompt_token_ids: Sequence[int],
                   output_tokens: int) -> list[Request]:
    """The n child requests of one request, ids `first_id`..`first_id + n - 1`, in the
    order they are added to the scheduler."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    prompt = tuple(prompt_token_ids)
    return [Request(first_id + index, arrival_s, len(prompt), output_tokens,
                    prompt_token_ids=prompt)
            for index in range(n)]
