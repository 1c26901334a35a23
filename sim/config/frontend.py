"""The serving frontend: what a client's latency holds besides the engine's steps.

A client of a vLLM server sees more than the engine: its request crosses the
HTTP/API server, the prompt is tokenized, and each output token is
detokenized and written to the stream. `Frontend` prices those as physical
terms with units. They add to every request's client-side TTFT and
end-to-end latency (the same for both, so TPOT is unchanged):

    client latency = engine latency + api_server_s
                     + tokenize_s_per_token * prompt tokens
                     + detokenize_s_per_token + stream_s_per_token

The per-token terms are measured on a CPU with servesim's shipped tokenizers
(`python -m calibrate.frontend_costs` prints them). The API server's constant
is fitted with the host terms on real vLLM runs (`python -m calibrate.fit_serving`).
Why a pure offset: the engine receives a request a few ms after the client
sent it, which shifts the engine's whole timeline and none of its decisions
(constant arrivals stay constant); the per-token part varies by tens of
microseconds between prompts, too little to reorder arrivals that matter.
`servesim serve` runs a real HTTP stack, so it sleeps only for tokenization and
detokenization.
"""

from __future__ import annotations

from dataclasses import dataclass

# Measured on this project's CI-class CPU with the shipped tokenizers (calibrate.frontend_costs)
# and fitted on the real vLLM runs (calibrate.fit_serving): see docs/real_servers.md.
# `python -m calibrate.frontend_costs` on the development machine (x86_64, Python 3.11, the
# mistral-v1 SentencePiece vocabulary of the Llama-2 family), 2026-12-07: 1.21-1.34, 7.1-8.5
# and 6.1-7.2 us over two runs of 50 passes
TOKENIZE_S_PER_TOKEN = 1.3e-06
DETOKENIZE_S_PER_TOKEN = 7.8e-06
STREAM_S_PER_TOKEN = 6.7e-06
API_SERVER_S = 0.0


@dataclass(frozen=True, slots=True)
class Frontend:
    """The client-side terms of one request's latency, in seconds."""

    api_server_s: float = API_SERVER_S
    tokenize_s_per_token: float = TOKENIZE_S_PER_TOKEN
    detokenize_s_per_token: float = DETOKENIZE_S_PER_TOKEN
    stream_s_per_token: float = STREAM_S_PER_TOKEN

    def __post_init__(self) -> None:
        for name in ("api_server_s", "tokenize_s_per_token", "detokenize_s_per_token",
                     "stream_s_per_token"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def offset_s(self, prompt_tokens: float) -> float:
        """Seconds a client waits beyond the engine for a token of a request with this prompt:
        in, the API server and the prompt's tokenization; out, the token's detokenization and
        stream write."""
        return (self.api_server_s + self.tokenize_s_per_token * prompt_tokens
                + self.detokenize_s_per_token + self.stream_s_per_token)

    @property
    def is_zero(self) -> bool:
        return self.offset_s(1) == 0.0 and self.tokenize_s_per_token == 0.0


NO_FRONTEND = Frontend(0.0, 0.0, 0.0, 0.0)
