"""Token ids for requests that arrive as lengths only.

Traces give prompt lengths (and Mooncake gives content ids of 512-token
pieces), not text. The engine needs real ids, and ids that respect the trace's
sharing: two requests whose prefix ids agree must get the same tokens there,
or the prefix cache would hand one request KV computed from another's text.
So a piece's tokens are a pure function of (seed, piece id), and a request
without content ids gets tokens drawn from (seed, request id).
"""

from __future__ import annotations

import numpy as np

from sim.core.request import Request

_PIECE_STREAM = 1  # keeps piece streams apart from per-request streams of the same number


def prompt_token_ids(request: Request, vocab_size: int, seed: int) -> list[int]:
    """The prompt's token ids: given ones (folded into the vocabulary), else synthesised."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if request.prompt_token_ids is not None:
        return [t % vocab_size for t in request.prompt_token_ids]
    if request.prefix_block_ids is not None:
        unit = request.prefix_unit_tokens
        ids: list[int] = []
        for piece in request.prefix_block_ids:
            rng = np.random.default_rng([seed, _PIECE_STREAM, piece])
            ids.extend(rng.integers(0, vocab_size, unit).tolist())
        if len(ids) < request.prompt_tokens:  # ids cover less than the prompt: pad per request
            rng = np.random.default_rng([seed, request.request_id])
            ids.extend(rng.integers(0, vocab_size, request.prompt_tokens - len(ids)).tolist())
        return ids[:request.prompt_tokens]
    rng = np.random.default_rng([seed, request.request_id])
    return rng.integers(0, vocab_size, request.prompt_tokens).tolist()
